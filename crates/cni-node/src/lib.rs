//! The node agent: watches Kubernetes `Node` objects and keeps this node's CNI network
//! config, its routes to other nodes' pod CIDRs, egress SNAT and the pod MTU in step.
