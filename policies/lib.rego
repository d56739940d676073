# Helpers shared by the default policies.
#
# rego-cpp 1.5 (the embedded engine) compares numbers as text inside the builtins
# max(), min() and sort(): max([80, 100]) is 80 there. These helpers use `<=`,
# which compares numbers correctly in every engine. `autoscaler policy check`
# refuses max()/min() for this reason.
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
