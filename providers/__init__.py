"""Backends that launch and terminate machines, one package each, behind `providers.base.Provider`.

Packages import only `providers.base` and their own SDK (lazily), never `autoscaler.*`;
`autoscaler.provisioning.build_provider` turns a pool's configuration into one.
"""
