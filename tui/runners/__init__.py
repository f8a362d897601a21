"""What runs an engine for the app: commands in, frames out (interface.py says how)."""
