"""Read-only analyses of HLO modules; each returns a result object."""
