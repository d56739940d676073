"""The policy service: Rego budgets, team priorities and placement rules evaluated on
every scaling decision (embedded rego-cpp in a child process, or an OPA server)."""
