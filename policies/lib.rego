# Helpers shared by the default policies.
#
# rego-cpp 1.5 (the embedded engine) compares numbers as text inside the builtins
# max(), min() and sort(): max([80, 100]) is 80 there. These helpers use `<=`,
# which compares numbers correctly in every engine. `autoscaler policy check`
# refuses max()/min() for this reason.
#
# regorus (the default embedded engine) rounds a tie away from zero in sprintf's
# `%.0f` (102.5 prints 103) where OPA and rego-cpp round it to even (102); `whole`
# rounds the way they do, so `sprintf("%d", [lib.whole(x)])` reads the same in all
# three. `autoscaler policy check` refuses `%.Nf` for this reason.
package autoscaler.lib

import rego.v1

# The largest number of a non-empty collection (undefined when empty).
max_of(xs) := m if {
	some m in xs
	every x in xs {
		x <= m
	}
}

# The smallest number of a non-empty collection (undefined when empty).
min_of(xs) := m if {
	some m in xs
	every x in xs {
		x >= m
	}
}

# The larger / smaller of two numbers.
larger(a, b) := a if {
	a >= b
} else := b

smaller(a, b) := a if {
	a <= b
} else := b

# x rounded to the nearest whole number, a tie to the even one (printf's `%.0f`).
# x - floor(x) is exact for any amount a budget holds, so the tie test is exact too.
whole(x) := n if {
	n := floor(x)
	x - n < 0.5
} else := n + 1 if {
	n := floor(x)
	x - n > 0.5
} else := n if {
	n := floor(x)
	n % 2 == 0
} else := floor(x) + 1
