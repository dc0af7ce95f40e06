"""The tp topic's registry entry (light: no torch; see :mod:`shardlab.core.topics`)."""

from shardlab.core.topics import ChartSpec, Lesson, Topic
from shardlab.tp.params import AttentionParams, MlpParams, VocabParams

SUMMARY = "tensor parallelism: Megatron's MLP and attention, vocab-parallel embedding and cross-entropy"
TOPIC = Topic("tp", SUMMARY, (
    Lesson(MlpParams, charts=(
        ChartSpec("Megatron MLP: all-reduce payload per rank vs tp (forward + backward)", "02_megatron_mlp",
                  r"mlp\.by_tp\.tp(?P<x>\d+)\.fwd_bwd\.all_reduce\.bytes", "bytes per rank", "tp"),
    )),
    Lesson(AttentionParams),
    Lesson(VocabParams, charts=(
        ChartSpec("Vocab-parallel cross-entropy: wire-byte saving over gathered logits vs vocabulary",
                  "04_vocab_parallel_embedding_ce", r"ce\.by_vocab\.V(?P<x>\d+)\.saving_ratio",
                  "gathered / vocab-parallel wire bytes", "vocabulary V", log_x=True),
    )),
))
