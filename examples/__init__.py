"""Example programs and the Python callables they name (`call = "examples.net:top_talkers"`)."""
