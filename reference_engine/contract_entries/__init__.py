"""Engine-level contract entries (whole-model contracts) and the minimal driver they use."""
