# Generated from thrift/*.thrift by `python -m yarnflow.common.rpc.codegen`: do not edit by hand.
"""Gateways (client side) and handlers (server side) of every service in the IDL, one module per service."""

from __future__ import annotations

from yarnflow.common.rpc.services.dispatcher import (
    DISPATCHER as DISPATCHER,
    DISPATCHER_METHODS as DISPATCHER_METHODS,
    DispatcherServiceCalls as DispatcherServiceCalls,
    DispatcherServiceGateway as DispatcherServiceGateway,
    DispatcherServiceHandler as DispatcherServiceHandler,
)
from yarnflow.common.rpc.services.job_master import (
    JOB_MASTER as JOB_MASTER,
    JOB_MASTER_METHODS as JOB_MASTER_METHODS,
    JobMasterServiceCalls as JobMasterServiceCalls,
    JobMasterServiceGateway as JobMasterServiceGateway,
    JobMasterServiceHandler as JobMasterServiceHandler,
)
from yarnflow.common.rpc.services.resource_manager import (
    RESOURCE_MANAGER as RESOURCE_MANAGER,
    RESOURCE_MANAGER_METHODS as RESOURCE_MANAGER_METHODS,
    ResourceManagerServiceCalls as ResourceManagerServiceCalls,
    ResourceManagerServiceGateway as ResourceManagerServiceGateway,
    ResourceManagerServiceHandler as ResourceManagerServiceHandler,
)
from yarnflow.common.rpc.services.task_executor import (
    TASK_EXECUTOR as TASK_EXECUTOR,
    TASK_EXECUTOR_METHODS as TASK_EXECUTOR_METHODS,
    TaskExecutorServiceCalls as TaskExecutorServiceCalls,
    TaskExecutorServiceGateway as TaskExecutorServiceGateway,
    TaskExecutorServiceHandler as TaskExecutorServiceHandler,
)
