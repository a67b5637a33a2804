# Generated from thrift/yarnflow.thrift by `python -m yarnflow.common.rpc.codegen`: do not edit by hand.
