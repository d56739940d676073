# Where work may run: pools and regions per team and per queue, a spot price cap,
# pool caps, and on-prem machines before cloud ones. Settings: data/placement.yaml.
package autoscaler.placement

import data.autoscaler.lib
import rego.v1

teams_conf := object.get(data.placement, "teams", {})

queues_conf := object.get(data.placement, "queues", {})

pools_conf := object.get(data.placement, "pools", {})

all_pools := [p.name | some p in input.pools]

# Pools a restriction (`pools` and/or `regions`) allows, or null when it sets neither.
restrict(c, candidates) := null if {
	not c.pools
	not c.regions
} else := [p.name |
	some p in input.pools
	p.name in candidates
	p.name in object.get(c, "pools", candidates)
	p.region in object.get(c, "regions", [p.region])
]

# Pools each team listed in data may use (a team not listed may use every pool).
team_pools[t.name] := allowed if {
	everywhere := all_pools
	some t in input.teams
	c := teams_conf[t.name]
	allowed := restrict(c, everywhere)
	allowed != null
}

max_spot_price(name) := object.get(object.get(teams_conf, name, {}), "max_spot_price_usd", object.get(data.placement, "max_spot_price_usd", null))

reasons contains [name, msg] if {
	some name, allowed in team_pools
	msg := sprintf("placement: limited to pools %v", [allowed])
}

# Only queues named in data get a queue decision; the settings are bound once, before
# the loop over queues, so they are not re-read for each of them, and with none in the
# data the queues are not looked at (1,000 of them cost the engine a millisecond).
queues[q.name] := {"allowed_pools": allowed, "reasons": [sprintf("placement: queue limited to pools %v", [allowed])]} if {
	conf := queues_conf
	count(conf) > 0
	some q in input.queues
	c := conf[q.name]
	allowed := restrict(c, q.pools)
	allowed != null
}

# ---- on-prem first
#
# The service derives, per pool, `backlog` (tasks queued in the queues it serves)
# and `onprem_idle_peers` (idle on-prem machines serving one of those queues).

onprem_covers[p.name] := msg if {
	object.get(data.placement, "onprem_first", false) == true
	some p in input.pools
	p.kind == "cloud"
	p.onprem_idle_peers > 0
	p.onprem_idle_peers >= p.backlog
	msg := sprintf("placement: on-prem first, %d idle on-prem machine(s) cover the backlog of %d task(s)", [p.onprem_idle_peers, p.backlog])
}

# ---- per pool caps
#
# rego-cpp does not cache a rule's value within one query, so rules used once per
# pool are bound to local variables first (`covers`, `reasons`): this keeps a
# 50-pool, 1,000-queue input in milliseconds rather than seconds.

cap_from_data(name) := c if {
	c := pools_conf[name].max_instances
} else := null

pools := {p.name: d |
	some p in input.pools
	caps := [c | some c in [cap_from_data(p.name), onprem_cap(p, covers)]; c != null]
	count(caps) > 0
	d := {"max_instances": lib.min_of(caps), "reasons": sort([msg | some r in reasons; r[0] == p.name; msg := r[1]])}
} if {
	covers := onprem_covers
	reasons := pool_reasons
}

onprem_cap(p, covers) := p.current_instances if {
	covers[p.name]
} else := null

pool_reasons contains [p.name, msg] if {
	some p in input.pools
	c := cap_from_data(p.name)
	c != null
	msg := sprintf("placement: capped at %v instance(s) by data/placement.yaml", [c])
}

pool_reasons contains [name, msg] if {
	some name, msg in onprem_covers
}

# Pools in the order they should be used: on-prem first, then by cheapest price,
# then by name. The service hands the pool names already ordered by cheapest hourly
# price, then name (`input.pools_by_price`), so this rule only puts the on-prem
# (static) pools before the cloud ones, keeping that order within each.
onprem_pools contains p.name if {
	some p in input.pools
	p.kind == "static"
}

pool_order := array.concat(first, rest) if {
	onprem := onprem_pools
	first := [name | some name in input.pools_by_price; onprem[name]]
	rest := [name | some name in input.pools_by_price; not onprem[name]]
}
