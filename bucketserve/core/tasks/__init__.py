"""The tasks a model serves beside its outputs, one module a task, each holding its rule (what
the config's section says, read at load by `loading.rules`) and its head (what turns a
sequence's outputs into the task's answer, in the worker): `embedding` (embed), `classifier`
(classify, rerank), `sparse` (embed_sparse, embed_all), `entities` (classify_tokens),
`tokenize` (the tokenizer alone). They import the heads' protocol, the labels' rule and the
model below them, never each other (tests/test_layering.py holds it).
"""
