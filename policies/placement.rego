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

allowed_pools(name) := restrict(object.get(teams_conf, name, {}), all_pools)

max_spot_price(name) := object.get(object.get(teams_conf, name, {}), "max_spot_price_usd", object.get(data.placement, "max_spot_price_usd", null))

reasons contains [t.name, msg] if {
	some t in input.teams
	allowed := allowed_pools(t.name)
	allowed != null
	msg := sprintf("placement: limited to pools %v", [allowed])
}

queues[q.name] := {"allowed_pools": allowed, "reasons": [sprintf("placement: queue limited to pools %v", [allowed])]} if {
	some q in input.queues
	c := queues_conf[q.name]
	allowed := restrict(c, q.pools)
	allowed != null
}

# ---- on-prem first

pool_by_name[p.name] := p if some p in input.pools

# Idle on-prem machines that could take the work of a cloud pool's queues.
onprem_idle(cloud) := sum([object.get(s, "idle_instances", 0) |
	some s in input.pools
	s.kind == "static"
	shares_queue(s.name, cloud)
])

shares_queue(a, b) if {
	some q in input.queues
	a in q.pools
	b in q.pools
}

# Tasks waiting in the queues a pool serves.
backlog(pool) := sum([q.depth | some q in input.queues; pool in q.pools])

onprem_covers[p.name] := msg if {
	object.get(data.placement, "onprem_first", false) == true
	some p in input.pools
	p.kind == "cloud"
	idle := onprem_idle(p.name)
	idle > 0
	idle >= backlog(p.name)
	msg := sprintf("placement: on-prem first, %d idle on-prem machine(s) cover the backlog of %d task(s)", [idle, backlog(p.name)])
}

# ---- per pool caps

cap_from_data(name) := c if {
	c := pools_conf[name].max_instances
} else := null

pools[p.name] := decision if {
	some p in input.pools
	caps := [c | some c in [cap_from_data(p.name), onprem_cap(p.name)]; c != null]
	count(caps) > 0
	decision := {
		"max_instances": lib.min_of(caps),
		"reasons": sort([msg | some r in pool_reasons; r[0] == p.name; msg := r[1]]),
	}
}

onprem_cap(name) := pool_by_name[name].current_instances if {
	onprem_covers[name]
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
# then by name. Ordered by counting the pools that come before each one, because
# rego-cpp's sort() compares numbers as text.
cheapest(p) := lib.min_of([v | some v in p.hourly_prices]) if {
	count(p.hourly_prices) > 0
} else := 0

rank(p) := 0 if {
	p.kind == "static"
} else := 1

before(a, b) if rank(a) < rank(b)

before(a, b) if {
	rank(a) == rank(b)
	cheapest(a) < cheapest(b)
}

before(a, b) if {
	rank(a) == rank(b)
	cheapest(a) == cheapest(b)
	a.name < b.name
}

position(p) := count([q | some q in input.pools; before(q, p)])

pool_order := [p.name | some i in numbers.range(0, count(input.pools) - 1); some p in input.pools; position(p) == i] if {
	count(input.pools) > 0
} else := []
