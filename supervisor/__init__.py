"""The supervisor: starts, stops and restarts worker and replayer processes of one site."""
