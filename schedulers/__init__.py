"""Stateless forward strategies (DESIGN 4). A scheduler reads the layer; it never imports it."""

from schedulers.external_comm import ExternalCommScheduler
from schedulers.plan import ForwardPlan, plan_forward, split_rows

__all__ = ["ExternalCommScheduler", "ForwardPlan", "plan_forward", "split_rows"]
