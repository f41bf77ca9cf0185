"""The choreographer: from every loaded program, replay and tail, which workers must run."""
