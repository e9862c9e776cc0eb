"""The vendors' APIs the HTTP edge speaks, one module each: its bodies, and for each a codec
(`codec.Codec`: the body to one call, the answer to its JSON) and the pages it serves. The
table of dialects (`edges.http.routes`) is the only module that imports them, and none
imports another (the import contracts hold both)."""
