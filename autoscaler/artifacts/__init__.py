"""Where tasks' code snapshots, outputs and checkpoints are kept: one small store
interface (`store.ArtifactStore`) with a local-directory backend, short-lived
task-scoped transfer tickets for workers (`tickets`), and the records the database
keeps of them (`records`)."""
