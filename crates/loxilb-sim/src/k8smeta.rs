//! `POST /config/k8smeta`: the Kubernetes metadata kube-loxilb sends with
//! `--enableK8sMetadata`. Not in loxilb's published swagger.yml: the body model is
//! kube-loxilb's (`pkg/api/meta.go`, docs/loxilb-api.md#kubernetes-metadata). The simulator
//! decodes it with Go's rules and keeps every body it got since it (re)started, for tests
//! to read ([`crate::Simulator::k8s_metadata_posts`]); a restart forgets them, as loxilb
//! forgets its state.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::decode::{GoInt, GoObj, body_object, parse_body};
use crate::errors::ApiError;

/// How many bodies the simulator keeps (the oldest go first).
pub const K8S_METADATA_LIMIT: usize = 1_000;

/// A pod of a body (`PodMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SimPodMeta {
    pub name: String,
    pub namespace: String,
    pub ip: String,
    pub node_name: String,
    pub labels: BTreeMap<String, String>,
}

/// A Service port of a body (`ServicePort`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SimServicePortMeta {
    pub port: i64,
    pub protocol: String,
    pub node_port: i64,
    pub target_port: i64,
}

/// A Service of a body (`ServiceMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SimServiceMeta {
    pub name: String,
    pub namespace: String,
    pub cluster_ip: String,
    pub external_ip: String,
    pub ports: Vec<SimServicePortMeta>,
}

/// A Node of a body (`NodeMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SimNodeMeta {
    pub name: String,
    pub internal_ip: String,
    pub labels: BTreeMap<String, String>,
    pub status: String,
}

/// One `POST /config/k8smeta` body as received (`K8sMetaModel`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SimK8sMeta {
    pub pods: Vec<SimPodMeta>,
    pub services: Vec<SimServiceMeta>,
    pub nodes: Vec<SimNodeMeta>,
}

impl SimK8sMeta {
    /// How many objects it carries.
    pub fn len(&self) -> usize {
        self.pods.len() + self.services.len() + self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Decodes a body: 400 on what Go's decoder refuses (a wrong type), unknown fields ignored,
/// `null` lists and items empty.
pub(crate) fn decode_post(bytes: &[u8]) -> Result<SimK8sMeta, ApiError> {
    let Some(v) = parse_body(bytes)? else {
        return Err(ApiError::required("attr", "body"));
    };
    let map = body_object(&v, "K8sMetaModel")?;
    let o = GoObj::new(&map, "K8sMetaModel");
    let text = |o: &GoObj<'_>, k: &str| o.string(k).map(Option::unwrap_or_default);
    let int = |o: &GoObj<'_>, k: &str| o.int(k, GoInt::I64).map(Option::unwrap_or_default);
    let labels = |o: &GoObj<'_>| o.string_map("labels").map(Option::unwrap_or_default);
    let mut body = SimK8sMeta::default();
    for p in o
        .object_array("pods", "PodMetadata")?
        .unwrap_or_default()
        .into_iter()
        .flatten()
    {
        body.pods.push(SimPodMeta {
            name: text(&p, "name")?,
            namespace: text(&p, "namespace")?,
            ip: text(&p, "ip")?,
            node_name: text(&p, "nodeName")?,
            labels: labels(&p)?,
        });
    }
    for s in o
        .object_array("services", "ServiceMetadata")?
        .unwrap_or_default()
        .into_iter()
        .flatten()
    {
        let mut ports = Vec::new();
        for port in s
            .object_array("ports", "ServicePort")?
            .unwrap_or_default()
            .into_iter()
            .flatten()
        {
            ports.push(SimServicePortMeta {
                port: int(&port, "port")?,
                protocol: text(&port, "protocol")?,
                node_port: int(&port, "nodePort")?,
                target_port: int(&port, "targetPort")?,
            });
        }
        body.services.push(SimServiceMeta {
            name: text(&s, "name")?,
            namespace: text(&s, "namespace")?,
            cluster_ip: text(&s, "clusterIP")?,
            external_ip: text(&s, "externalIP")?,
            ports,
        });
    }
    for n in o
        .object_array("nodes", "NodeMetadata")?
        .unwrap_or_default()
        .into_iter()
        .flatten()
    {
        body.nodes.push(SimNodeMeta {
            name: text(&n, "name")?,
            internal_ip: text(&n, "internalIP")?,
            labels: labels(&n)?,
            status: text(&n, "status")?,
        });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_loxilbs_body_decodes_and_wrong_types_are_refused() {
        let body = br#"{"pods":[{"name":"p","namespace":"a","ip":"10.244.0.1","nodeName":"n1","labels":{"app":"web"}}],
            "services":[{"name":"s","namespace":"a","clusterIP":"10.96.0.1","externalIP":"192.0.2.1",
              "ports":[{"port":80,"protocol":"TCP","nodePort":30080,"targetPort":8080}]}],
            "nodes":[{"name":"n1","internalIP":"10.0.0.1","labels":null,"status":"True"}],
            "unknown":1}"#;
        let m = decode_post(body).unwrap();
        assert_eq!(m.pods[0].labels["app"], "web");
        assert_eq!(m.services[0].ports[0].node_port, 30080);
        assert_eq!(m.nodes[0].status, "True");
        assert_eq!(m.len(), 3);
        assert!(decode_post(b"null").unwrap().is_empty());
        assert!(decode_post(br#"{"pods":{}}"#).is_err());
        assert!(decode_post(br#"{"nodes":[{"labels":{"a":1}}]}"#).is_err());
        assert!(decode_post(b"").is_err());
    }
}

/// The bodies received since the last (re)start, oldest first.
#[derive(Debug, Default)]
pub(crate) struct K8sMetaLog(std::collections::VecDeque<SimK8sMeta>);

impl K8sMetaLog {
    pub(crate) fn record(&mut self, body: SimK8sMeta) {
        if self.0.len() == K8S_METADATA_LIMIT {
            self.0.pop_front();
        }
        self.0.push_back(body);
    }

    pub(crate) fn all(&self) -> Vec<SimK8sMeta> {
        self.0.iter().cloned().collect()
    }
}
