"""Request and response bodies."""
