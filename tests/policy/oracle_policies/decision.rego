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
	"default_team": default_team,
	"pools": placement.pools,
	"queues": placement.queues,
	"pool_order": placement.pool_order,
	"alerts": [a | some a in budgets.alerts],
	"deny": sort([m | some m in budgets.deny]),
	"warn": sort([m | some m in warnings]),
}

# Each team's answer. Everything in it that depends on the whole input (frozen teams,
# quotas, reasons) is gathered into objects keyed by team once, in the `if` below, and
# the answer only looks them up: rego-cpp re-evaluates a rule every time a function
# body refers to it, so reading budgets.freeze or priorities.borrowable from inside a
# per-team function re-ran the budget and quota rules once per team (0.7 s at 100 teams).
teams := {t.name: team_decision(t.name, facts, object.get(reasons, t.name, [])) | some t in input.teams} if {
	facts := team_facts
	reasons := team_reasons
}

# The answer for a team the input does not list: only the data defaults, never another
# team's state.
default_team := team_decision("", {}, [])

warnings := budgets.warn | priorities.warn

# Per team, only for the teams they concern: frozen, draining, money headroom, quota
# full, GPUs borrowable, pools allowed.
team_facts := {
	"freeze": budgets.freeze,
	"drain": budgets.drain,
	"headroom": budgets.headroom,
	"quota_full": priorities.quota_full,
	"borrowable": priorities.borrowable,
	"allowed_pools": placement.team_pools,
}

# One team's answer from its facts (see `teams`); a fact a team does not appear in
# takes the permissive default.
team_decision(name, facts, reasons) := {
	"may_scale_up": may_scale_up(name, facts),
	"spend_headroom_per_hour": headroom(name, facts),
	"allowed_capacity_types": s.capacity_types,
	"allowed_pools": object.get(object.get(facts, "allowed_pools", {}), name, null),
	"priority_tier": s.tier,
	"priority_weight": s.weight,
	"drain": object.get(object.get(facts, "drain", {}), name, null) != null,
	"max_spot_price": placement.max_spot_price(name),
	"nominal_gpus": object.get(s.quota, "nominal_gpus", null),
	"borrowing_limit_gpus": object.get(object.get(facts, "borrowable", {}), name, null),
	"lending_limit_gpus": object.get(s.quota, "lending_limit_gpus", null),
	"reasons": reasons,
} if {
	s := priorities.settings(name)
}

may_scale_up(name, facts) := false if {
	facts.freeze[name]
} else := false if {
	facts.quota_full[name]
} else := true

# A frozen team has no headroom; a soft or missing budget means no money limit (null).
headroom(name, facts) := 0 if {
	facts.freeze[name]
} else := object.get(object.get(facts, "headroom", {}), name, null)

# Every reason of every policy, sorted, per team that has one.
team_reasons := {name: sorted_reasons(name, all) | some name in {r[0] | some r in all}} if {
	all := (budgets.reasons | priorities.reasons) | placement.reasons
}

sorted_reasons(name, all) := sort([msg | some r in all; r[0] == name; msg := r[1]])
