"""The HTTP edge: decode and validate requests, hand them to the engine, encode responses."""
