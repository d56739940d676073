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
# resolved with one look-up of its settings.
settings(name) := settings_of(conf(name))

settings_of(c) := {
	"tier_name": tn,
	"tier": object.get(object.get(tiers, tn, {}), "tier", 0),
	"weight": object.get(c, "weight", object.get(object.get(tiers, tn, {}), "weight", 1)),
	"capacity_types": capacity_types_of(object.get(c, "capacity", "any")),
	"quota": object.get(c, "quota", {}),
} if {
	tn := object.get(c, "tier", object.get(default_conf, "tier", ""))
}

# Every input team's settings, resolved once per evaluation: the settings of each team
# the data lists and of the default, then one look-up per input team. The per-team
# rules below and decision.rego read a team's settings here rather than calling
# conf/quota/nominal again in each rule: every nested function call costs the engine
# microseconds per team, and six rules did it for every team (docs/benchmarks.md).
team_settings := {t.name: object.get(listed, t.name, fallback) | some t in input.teams} if {
	listed := {name: settings_of(c) | some name, c in teams_conf; c}
	fallback := settings_of(default_conf)
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
	settings_by_team := team_settings
	some t in input.teams
	q := settings_by_team[t.name].quota
	nom := object.get(q, "nominal_gpus", null)
	is_number(nom)
	unused := lib.larger(0, nom - t.running_gpus)
	n := lib.smaller(unused, object.get(q, "lending_limit_gpus", unused))
}

# GPUs a team may borrow now: what the others lend, capped by its borrowing limit.
# What the others lend is the total lent minus the team's own share; the total is
# summed once, before the loop over teams (rego-cpp re-evaluates a rule referenced
# inside a loop, and summing per team made this quadratic in the number of teams).
borrowable[t.name] := n if {
	lent_by_team := lent
	total_lent := sum([v | some v in lent_by_team])
	settings_by_team := team_settings
	some t in input.teams
	q := settings_by_team[t.name].quota
	is_number(object.get(q, "nominal_gpus", null))
	others := total_lent - object.get(lent_by_team, t.name, 0)
	limit := object.get(q, "borrowing_limit_gpus", others)
	n := lib.smaller(others, limit)
}

# A team at nominal + borrowable GPUs may not grow.
quota_full[t.name] := msg if {
	can_borrow := borrowable
	settings_by_team := team_settings
	some t in input.teams
	nom := object.get(settings_by_team[t.name].quota, "nominal_gpus", null)
	is_number(nom)
	cap := nom + can_borrow[t.name]
	t.running_gpus >= cap
	msg := sprintf("quota: %d GPUs running, at its nominal %d plus %d borrowable from unused quota", [t.running_gpus, nom, can_borrow[t.name]])
}

reasons contains [name, msg] if {
	some name, msg in quota_full
}

reasons contains [t.name, msg] if {
	settings_by_team := team_settings
	some t in input.teams
	settings_by_team[t.name].capacity_types == ["spot"]
	msg := "priorities: spot capacity only"
}

warn contains msg if {
	settings_by_team := team_settings
	some t in input.teams
	name := settings_by_team[t.name].tier_name
	not tiers[name]
	msg := sprintf("%s names tier %q, which data/priorities.yaml does not define; it gets tier 0", [t.name, name])
}
