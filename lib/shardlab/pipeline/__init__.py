"""shardlab.pipeline — pipeline parallelism: schedules, their timelines, the automatic stage split, per-device
programs over `shardlab.comm`, PyTorch's own pipelining as the reference, and the SPMD (circular) pipeline.

schedules   Action, Schedule, gpipe / one_f_one_b / interleaved_1f1b, peak_inflight
timeline    simulate(schedule, forward, backward) -> Timeline (makespan, bubble per device)
split       trace (torch.fx + per-node FLOPs / bytes), best_cuts (DP), brute_force_cuts, even_cuts, split
programs    pipeline_program(comm, schedule, stages, ...): one device's step with send / recv; dense_step
torch_ref   torch_orders (PyTorch's executed action lists), torch_pipeline_program (its PipelineStage on gloo)
model       TinyLM: embedding -> blocks -> norm -> LM head, heavy ends with a large vocabulary
spmd        the circular pipeline as one SPMD program on torch_xla (imports torch_xla lazily)
"""
