# Team priorities, capacity types and GPU quota lending.
#
# Tiers and weights, spot-only teams and quotas live in data/priorities.yaml.
# Quota follows Kueue's cohort idea: every team with a quota is entitled to
# `nominal_gpus`; GPUs a team leaves unused may be borrowed by others, each borrower
# at most `borrowing_limit_gpus` beyond its own nominal quota.
package autoscaler.priorities

import data.autoscaler.lib
import rego.v1

tiers := object.get(data.priorities, "tiers", {})

teams_conf := object.get(data.priorities, "teams", {})

default_conf := object.get(data.priorities, "default", {})

conf(name) := teams_conf[name] if {
	teams_conf[name]
} else := default_conf

tier_name(name) := object.get(conf(name), "tier", object.get(default_conf, "tier", ""))

tier(name) := object.get(object.get(tiers, tier_name(name), {}), "tier", 0)

weight(name) := object.get(conf(name), "weight", object.get(object.get(tiers, tier_name(name), {}), "weight", 1))

capacity_types(name) := ["spot"] if {
	object.get(conf(name), "capacity", "any") == "spot_only"
} else := ["on_demand"] if {
	object.get(conf(name), "capacity", "any") == "on_demand_only"
} else := ["spot", "on_demand"]

quota(name) := object.get(conf(name), "quota", {})

# A team's answer from the data in one object: tier, weight, capacity types and quota
# resolved with one look-up of its settings (decision.rego reads this per team).
settings(name) := {
	"tier": object.get(object.get(tiers, tn, {}), "tier", 0),
	"weight": object.get(c, "weight", object.get(object.get(tiers, tn, {}), "weight", 1)),
	"capacity_types": capacity_types_of(object.get(c, "capacity", "any")),
	"quota": object.get(c, "quota", {}),
} if {
	c := conf(name)
	tn := object.get(c, "tier", object.get(default_conf, "tier", ""))
}

capacity_types_of(capacity) := ["spot"] if {
	capacity == "spot_only"
} else := ["on_demand"] if {
	capacity == "on_demand_only"
} else := ["spot", "on_demand"]

nominal(name) := object.get(quota(name), "nominal_gpus", null)

# Running GPUs per team in the input.
running[t.name] := t.running_gpus if some t in input.teams

# GPUs a team with a quota leaves unused and lends to the cohort.
lent[t.name] := n if {
	some t in input.teams
	nom := nominal(t.name)
	is_number(nom)
	unused := lib.larger(0, nom - t.running_gpus)
	n := lib.smaller(unused, object.get(quota(t.name), "lending_limit_gpus", unused))
}

# GPUs a team may borrow now: what the others lend, capped by its borrowing limit.
# What the others lend is the total lent minus the team's own share; the total is
# summed once, before the loop over teams (rego-cpp re-evaluates a rule referenced
# inside a loop, and summing per team made this quadratic in the number of teams).
borrowable[t.name] := n if {
	lent_by_team := lent
	total_lent := sum([v | some v in lent_by_team])
	some t in input.teams
	is_number(nominal(t.name))
	others := total_lent - object.get(lent_by_team, t.name, 0)
	limit := object.get(quota(t.name), "borrowing_limit_gpus", others)
	n := lib.smaller(others, limit)
}

# A team at nominal + borrowable GPUs may not grow.
quota_full[t.name] := msg if {
	can_borrow := borrowable
	some t in input.teams
	nom := nominal(t.name)
	is_number(nom)
	cap := nom + can_borrow[t.name]
	t.running_gpus >= cap
	msg := sprintf("quota: %d GPUs running, at its nominal %d plus %d borrowable from unused quota", [t.running_gpus, nom, can_borrow[t.name]])
}

reasons contains [name, msg] if {
	some name, msg in quota_full
}

reasons contains [t.name, msg] if {
	some t in input.teams
	capacity_types(t.name) == ["spot"]
	msg := "priorities: spot capacity only"
}

warn contains msg if {
	some t in input.teams
	name := tier_name(t.name)
	not tiers[name]
	msg := sprintf("%s names tier %q, which data/priorities.yaml does not define; it gets tier 0", [t.name, name])
}
