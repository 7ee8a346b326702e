"""Pydantic models of the two document kinds (skills and contracts): the edges of the toolbox."""
