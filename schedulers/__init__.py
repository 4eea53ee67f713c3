"""Stateless forward strategies (DESIGN 4). A scheduler reads the layer; it never imports it."""

from schedulers.dbo import DualBatchOverlapScheduler
from schedulers.dbo_rule import DBOConfig, SplitDecision, decide_split
from schedulers.external_comm import ExternalCommScheduler
from schedulers.plan import ForwardPlan, plan_forward, split_rows

__all__ = ["ExternalCommScheduler", "DualBatchOverlapScheduler", "DBOConfig", "SplitDecision",
           "decide_split", "ForwardPlan", "plan_forward", "split_rows"]
