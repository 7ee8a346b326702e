"""A bundled script the demo method skill mentions."""

print("demo")
