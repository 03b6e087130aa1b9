//! BGP on each loxilb: its goBGP's global settings and neighbours, from the operator's
//! settings (docs/bgp.md).
//!
//! loxilb keeps no BGP state across a restart (its goBGP is respawned empty) and answers a
//! second global POST with an error, so the global settings are sent once per loxilb start
//! (again after a restart or a come-back). Neighbours are compared with what loxilb lists at
//! every health tick: missing ones are added, ones the settings no longer name are removed
//! (this controller owns loxilb's neighbour list). The listing also gives each session's
//! state, exported as a metric. goBGP answers errors for a moment after loxilb starts: the
//! next tick tries again.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use loxi_domain::bgp::BgpSettings;
use loxilb_client::ClientError;
use loxilb_client::bgp::{BgpGlobal, BgpNeighbor};
use tracing::{info, warn};

use super::Instance;
use crate::metrics::Metrics;

/// What this controller knows of one loxilb's BGP.
#[derive(Debug, Default)]
pub(super) struct BgpState {
    /// The global settings sent since loxilb last (re)started.
    global: Option<BgpGlobal>,
    /// Peers whose session state the metric shows for this instance.
    shown: BTreeSet<(String, String)>,
}

impl Instance {
    /// loxilb restarted or came back: its goBGP holds nothing any more.
    pub async fn forget_bgp(&self) {
        self.bgp.lock().await.global = None;
    }

    /// The router id for this loxilb: the configured one, else its own IPv4 address.
    fn router_id(&self, settings: &BgpSettings) -> Option<Ipv4Addr> {
        settings.router_id.or_else(|| {
            let url = url::Url::parse(self.url()).ok()?;
            match url.host()? {
                url::Host::Ipv4(ip) => Some(ip),
                _ => None,
            }
        })
    }

    /// Brings loxilb's BGP to `settings`: global settings once per loxilb start, neighbours
    /// added and removed, session states into the metric.
    pub async fn ensure_bgp(
        &self,
        settings: &BgpSettings,
        metrics: &Metrics,
    ) -> Result<(), ClientError> {
        let mut state = self.bgp.lock().await;
        let Some(router_id) = self.router_id(settings) else {
            return Err(ClientError::Config(format!(
                "no BGP router id for {}: its address is not IPv4; set --bgp-router-id",
                self.url()
            )));
        };
        let global = BgpGlobal {
            router_id,
            local_as: settings.local_asn.get(),
            set_next_hop_self: false,
            listen_port: settings.listen_port.unwrap_or(0),
        };
        if state.global.as_ref() != Some(&global) {
            self.client.set_bgp_global(&global).await?;
            info!(instance = self.url(), %router_id, local_as = global.local_as, "BGP global settings sent");
            state.global = Some(global);
        }
        let listed = self.client.list_bgp_neighbors().await?;
        let wanted: Vec<BgpNeighbor> = settings
            .peers
            .iter()
            .map(|p| BgpNeighbor {
                ip_address: p.address,
                remote_as: p.asn.get(),
                remote_port: p.port.unwrap_or(0),
                set_multi_hop: settings.multihop,
            })
            .collect();
        let listed_ip =
            |n: &loxilb_client::bgp::BgpNeighborStatus| n.ip_address.parse::<IpAddr>().ok();
        for peer in &wanted {
            let present = listed
                .iter()
                .any(|n| listed_ip(n) == Some(peer.ip_address) && n.remote_as == peer.remote_as);
            if !present {
                self.client.add_bgp_neighbor(peer).await?;
                info!(instance = self.url(), peer = %peer.ip_address, remote_as = peer.remote_as, "BGP neighbour added");
            }
        }
        for n in &listed {
            let Some(ip) = listed_ip(n) else { continue };
            let still = wanted
                .iter()
                .any(|p| p.ip_address == ip && p.remote_as == n.remote_as);
            if !still {
                match self.client.delete_bgp_neighbor(ip, n.remote_as).await {
                    Ok(_) => info!(instance = self.url(), peer = %ip, "BGP neighbour removed"),
                    Err(e) => {
                        warn!(instance = self.url(), peer = %ip, error = %e, "could not remove a BGP neighbour")
                    }
                }
            }
        }
        let now: BTreeSet<(String, String)> = listed
            .iter()
            .filter(|n| listed_ip(n).is_some_and(|ip| wanted.iter().any(|p| p.ip_address == ip)))
            .map(|n| (n.ip_address.clone(), n.state.clone()))
            .collect();
        for (peer, s) in state.shown.difference(&now) {
            metrics.set_bgp_session(self.url(), peer, s, false);
        }
        for (peer, s) in &now {
            metrics.set_bgp_session(self.url(), peer, s, true);
        }
        state.shown = now;
        Ok(())
    }
}
