"""Discrete-event simulator: replays GPU cluster traces through the real reconciler,
policy engine and queueing code with a virtual clock and the fake provider."""
