"""Templates for `toolbox new` and the small text edits that keep cross references two-way."""
