//! Which Node changes re-plan the served Services.
//!
//! In the default endpoint mode every served Service uses every eligible Node, so any change
//! to what the planner reads of a Node (address, readiness, exclusion, deletion) re-queues
//! them all; heartbeats and other status noise do not.
//!
//! The decision reads the watch events themselves, not the Node store: during a listing
//! (start-up, or a re-list after the watch expired) the reflector fills its store only at the
//! listing's end, so an event-time look at the store would miss every Node of the listing,
//! and a Node that was there at start-up and never changed would not be noticed when it is
//! deleted.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use loxi_domain::NodeView;
use tracing::warn;

use crate::k8s::view::node_view;
use crate::service::Context;

/// What the planner last saw of each Node, and the listing under way.
#[derive(Debug, Default)]
pub struct NodeChanges {
    seen: HashMap<String, NodeView>,
    /// Views gathered by a listing that has not ended yet.
    listing: Option<HashMap<String, NodeView>>,
}

impl NodeChanges {
    /// Takes one watch event; true when what the planner reads of the Nodes changed (the
    /// store already holds the new state when this is called).
    pub fn observe(&mut self, event: watcher::Event<NodeView>) -> bool {
        match event {
            watcher::Event::Apply(view) => {
                let name = view.name.clone();
                self.seen.insert(name, view.clone()) != Some(view)
            }
            watcher::Event::Delete(view) => self.seen.remove(&view.name).is_some(),
            watcher::Event::Init => {
                self.listing = Some(HashMap::new());
                false
            }
            watcher::Event::InitApply(view) => {
                self.listing
                    .get_or_insert_with(HashMap::new)
                    .insert(view.name.clone(), view);
                false
            }
            watcher::Event::InitDone => {
                // Nodes deleted while nothing watched are the ones the listing lacks.
                let listed = self.listing.take().unwrap_or_default();
                let changed = listed != self.seen;
                self.seen = listed;
                changed
            }
        }
    }
}

/// Re-queues every served Service when the Nodes change (module docs).
pub async fn watch_nodes(
    ctx: Arc<Context>,
    events: impl futures::Stream<Item = Result<watcher::Event<Node>, watcher::Error>>,
) {
    let mut changes = NodeChanges::default();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                warn!(error = %e, "node watch error");
                continue;
            }
        };
        if changes.observe(viewed(event)) {
            // Before any re-queue: the reconciles it triggers must not reuse older views
            // (heartbeats and other changes the views do not show keep the cache).
            ctx.inputs.nodes_changed();
            if ctx.gate.is_ready() {
                ctx.requeue_all_served();
            }
        }
    }
}

/// The event as the planner sees its Node.
fn viewed(event: watcher::Event<Node>) -> watcher::Event<NodeView> {
    use watcher::Event;
    match event {
        Event::Apply(n) => Event::Apply(node_view(&n)),
        Event::Delete(n) => Event::Delete(node_view(&n)),
        Event::Init => Event::Init,
        Event::InitApply(n) => Event::InitApply(node_view(&n)),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use watcher::Event;

    fn view(name: &str, ready: bool) -> NodeView {
        NodeView {
            name: name.into(),
            internal_ip: Some(format!("10.0.0.{}", name.len()).parse().unwrap()),
            ready,
            ..NodeView::default()
        }
    }

    fn listed(changes: &mut NodeChanges, nodes: &[NodeView]) -> bool {
        let mut changed = changes.observe(Event::Init);
        for n in nodes {
            changed |= changes.observe(Event::InitApply(n.clone()));
        }
        changed | changes.observe(Event::InitDone)
    }

    #[test]
    fn a_node_present_at_start_up_is_noticed_when_deleted_or_changed() {
        let mut c = NodeChanges::default();
        assert!(listed(&mut c, &[view("a", true), view("bb", true)]));
        assert!(c.observe(Event::Delete(view("a", true))), "deletion missed");
        assert!(
            c.observe(Event::Apply(view("bb", false))),
            "readiness missed"
        );
        assert!(!c.observe(Event::Apply(view("bb", false))), "no change");
    }

    #[test]
    fn a_relist_notices_nodes_deleted_while_nothing_watched() {
        let mut c = NodeChanges::default();
        listed(&mut c, &[view("a", true), view("bb", true)]);
        assert!(!listed(&mut c, &[view("a", true), view("bb", true)]));
        assert!(listed(&mut c, &[view("a", true)]));
        assert!(
            !c.observe(Event::Delete(view("bb", true))),
            "already gone with the relist"
        );
    }
}
