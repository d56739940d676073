"""The reconcile loop: observe the providers and the database, ask the policy, plan, act, record."""
