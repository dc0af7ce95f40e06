"""shardlab.pipeline — pipeline parallelism: schedules, their timelines, the automatic stage split, per-device
programs over `shardlab.comm`, PyTorch's own pipelining as the reference, the SPMD (circular) pipeline, and
notebook 09's parameters, cases and exercise solutions.

params      PipelineParams (notebook 09; light: no torch)
schedules   Action, Schedule, gpipe / one_f_one_b / interleaved_1f1b, peak_inflight
timeline    simulate(schedule, forward, backward) -> Timeline (makespan, bubble per device); compare (explorer rows)
split       trace (torch.fx + per-node FLOPs / bytes), best_cuts (DP), brute_force_cuts, even_cuts, split,
            compare_splits (auto vs even: stage costs, step time)
programs    pipeline_program(comm, schedule, stages, ...): one device's step with send / recv; dense_step
torch_ref   torch_orders (PyTorch's executed action lists), torch_pipeline_program (its PipelineStage on gloo)
model       TinyLM: embedding -> blocks -> norm -> LM head, heavy ends with a large vocabulary
spmd        the circular pipeline as one SPMD program on torch_xla (imports torch_xla lazily)
case        ScheduleCase / ShiftCase / FsdpCase for shardlab.core.harness (import after runtime.setup())
solutions   notebook 09's exercise solutions
"""
