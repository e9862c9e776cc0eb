"""The HTTP edge: connections, the app, and its routes; bytes in, a call to the core, bytes out."""
