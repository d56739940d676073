# The decision the autoscaler acts on, assembled from the three policies:
# budgets.rego (money), priorities.rego (who first, which capacity, quota) and
# placement.rego (where). Its shape is docs/schemas/policy-decision.v1.json.
package autoscaler

import data.autoscaler.budgets
import data.autoscaler.placement
import data.autoscaler.priorities
import rego.v1

decision := {
	"schema_version": "1",
	"teams": teams,
	"default_team": team_decision("", false),
	"pools": placement.pools,
	"queues": placement.queues,
	"pool_order": placement.pool_order,
	"alerts": [a | some a in budgets.alerts],
	"deny": sort([m | some m in budgets.deny]),
	"warn": sort([m | some m in warnings]),
}

teams[t.name] := team_decision(t.name, true) if some t in input.teams

warnings := budgets.warn | priorities.warn

# One team's answer. `known` is false for the default answer (a team the input does
# not list), which only gets the data defaults, never another team's state.
team_decision(name, known) := {
	"may_scale_up": may_scale_up(name),
	"spend_headroom_per_hour": headroom(name),
	"allowed_capacity_types": priorities.capacity_types(name),
	"allowed_pools": placement.allowed_pools(name),
	"priority_tier": priorities.tier(name),
	"priority_weight": priorities.weight(name),
	"drain": drain(name),
	"max_spot_price": placement.max_spot_price(name),
	"nominal_gpus": priorities.nominal(name),
	"borrowing_limit_gpus": object.get(priorities.borrowable, name, null),
	"reasons": team_reasons(name, known),
}

may_scale_up(name) := false if {
	budgets.freeze[name]
} else := false if {
	priorities.quota_full[name]
} else := true

# A frozen team has no headroom; a soft or missing budget means no money limit (null).
headroom(name) := 0 if {
	budgets.freeze[name]
} else := object.get(budgets.headroom, name, null)

drain(name) := true if {
	budgets.drain[name]
} else := false

team_reasons(_, false) := []

team_reasons(name, true) := sort([msg |
	some r in ((budgets.reasons | priorities.reasons) | placement.reasons)
	r[0] == name
	msg := r[1]
])
