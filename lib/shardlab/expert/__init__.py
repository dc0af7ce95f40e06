"""shardlab.expert — expert parallelism: a top-k routed MoE layer split over ep ranks by expert (notebook 11).

params     ExpertParams: the notebook's parameters, which are the layer's configuration (light: no torch)
moe        the layer built from them (router, capacity with token dropping, dropless variant, SwiGLU experts), the
           dense oracle (loops over experts) and GShard's dispatch / combine tensors
parallel   per rank over a `shardlab.comm.Comm`: dispatch and combine all-to-alls (differentiable `all_to_all`)
drops      tokens dropped vs capacity factor: measured, from the router's loads, under uniform routing
gspmd      GShard's dispatch / combine einsums with experts sharded on an `expert` mesh axis (`Reshard`; imports
           torch_xla: after runtime.setup())
case       MoECase: the layer through the harness's four views (formula, ledger, XLA:CPU, XLA:TPU)
solutions  the graded exercises of notebook 11

Nothing is imported here: the notebook imports ``shardlab.expert.params`` before ``runtime.setup()``.
"""
