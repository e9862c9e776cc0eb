"""Bulk jobs: a file of requests run as a batch (OpenAI's Files and Batch API, and
`bucketserve batch run`), below the protocol edges that offer them and over the engine whose
tokenizers order them.

The flow, one way: `store` keeps files and each batch's state on disk (SQLite for the state,
plain files for the data, a `reserve` of room for recording ends); `lines` reads an input
file and refuses it whole where OpenAI does, keeping where each request lies; `ordering`
orders the requests by length and `plan` keeps that order on disk; `runner` reads each
request from the file and sends it, in that order and at the bulk level, through the one
request path (`sender`: a `Dispatch`, its route's function in process, which the process
makes; the one rule of sending again while the server has no room), and `writer` writes
the answers back in checkpoints; `jobs` starts, resumes, cancels and stops the runners.
"""
