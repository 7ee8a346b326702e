"""The inference skills toolbox: validate skills and contracts, run contracts, benchmark, build the site."""

__version__ = "0.1.0"
