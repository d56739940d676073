# Monthly team budgets: alerts at thresholds, freeze at the forecast, drain at the limit.
#
# Budgets live in data/budgets.yaml; spend comes from the input
# (month_to_date_usd, forecast_usd, burn_rate_usd_per_hour per team).
package autoscaler.budgets

import data.autoscaler.lib
import rego.v1

thresholds := object.get(data.budgets, "thresholds_pct", [50, 80, 100])

teams_conf := object.get(data.budgets, "teams", {})

default_conf := object.get(data.budgets, "default", {})

# The budget entry that applies to a team: its own, else the default.
conf(name) := teams_conf[name] if {
	teams_conf[name]
} else := default_conf

# A team's monthly budget in USD, or null when it has none.
budget_usd(name) := object.get(conf(name), "monthly_usd", null)

kind(name) := object.get(conf(name), "kind", "soft")

# Per team with a budget: percentages of it spent and forecast.
status[t.name] := s if {
	some t in input.teams
	b := budget_usd(t.name)
	is_number(b)
	b > 0
	s := {
		"kind": kind(t.name),
		"budget_usd": b,
		"actual_pct": (100 * t.month_to_date_usd) / b,
		"forecast_pct": (100 * t.forecast_usd) / b,
		"forecast_usd": t.forecast_usd,
	}
}

# The highest threshold a percentage has reached (0 when none).
highest(pct) := lib.max_of(reached) if {
	reached := [th | some th in thresholds; pct >= th]
	count(reached) > 0
} else := 0

level(th) := "critical" if {
	th >= 100
} else := "warning" if {
	th >= 80
} else := "info"

alerts contains alert if {
	some name, s in status
	top := highest(s.actual_pct)
	top > 0
	alert := {
		"team": name,
		"level": level(top),
		"threshold_pct": top,
		"basis": "actual",
		"message": sprintf("%s has spent %d%% of its %s monthly budget of $%d (threshold %v%%)", [name, lib.whole(s.actual_pct), s.kind, lib.whole(s.budget_usd), top]),
	}
}

# A forecast alert only when the forecast crosses a threshold the actual spend has not.
alerts contains alert if {
	some name, s in status
	top := highest(s.forecast_pct)
	top > highest(s.actual_pct)
	alert := {
		"team": name,
		"level": level(top),
		"threshold_pct": top,
		"basis": "forecast",
		"message": sprintf("%s is forecast to spend %d%% of its %s monthly budget of $%d by month end (threshold %v%%)", [name, lib.whole(s.forecast_pct), s.kind, lib.whole(s.budget_usd), top]),
	}
}

# Hard budgets: no new capacity once the month-end forecast reaches the budget.
freeze[name] := reason if {
	some name, s in status
	s.kind == "hard"
	s.forecast_pct >= 100
	reason := sprintf("budget: scale-up frozen, forecast $%d reaches the hard budget of $%d", [lib.whole(s.forecast_usd), lib.whole(s.budget_usd)])
}

# Hard budgets: drain the team's capacity once actual spend reaches the budget.
drain[name] := reason if {
	some name, s in status
	s.kind == "hard"
	s.actual_pct >= 100
	reason := sprintf("budget: hard budget of $%d spent (%d%%); draining", [lib.whole(s.budget_usd), lib.whole(s.actual_pct)])
}

# USD per hour of new capacity a hard-budget team may add and still end the month
# within budget: (budget - forecast) / hours left. At least one hour is assumed so the
# last minutes of a month do not turn a few dollars into an unlimited rate.
headroom[name] := h if {
	some name, s in status
	s.kind == "hard"
	hours := lib.larger(input.hours_left_in_period, 1)
	h := lib.larger(0, (s.budget_usd - s.forecast_usd) / hours)
}

reasons contains [name, msg] if {
	some name, msg in freeze
}

reasons contains [name, msg] if {
	some name, msg in drain
}

reasons contains [name, msg] if {
	some name, s in status
	s.kind == "soft"
	s.forecast_pct >= 100
	msg := sprintf("budget: soft budget of $%d forecast at %d%%; alert only", [lib.whole(s.budget_usd), lib.whole(s.forecast_pct)])
}

warn contains msg if {
	some name, s in status
	s.kind == "soft"
	s.actual_pct >= 100
	msg := sprintf("%s is over its soft budget: $%d of $%d", [name, lib.whole((s.actual_pct * s.budget_usd) / 100), lib.whole(s.budget_usd)])
}

warn contains msg if {
	budgeted := status
	some t in input.teams
	not budgeted[t.name]
	msg := sprintf("%s has no monthly budget in data/budgets.yaml; its spend is unlimited", [t.name])
}

deny contains msg if {
	some name, reason in freeze
	msg := sprintf("%s: %s", [name, reason])
}
