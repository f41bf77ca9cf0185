"""The choreographer: decides which workers must run, from programs, replays and tails."""
