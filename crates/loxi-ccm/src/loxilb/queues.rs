//! What waits in each loxilb's write window, as the admin server's `/queues` shows it and
//! `loxi-ccm check` prints it (docs/architecture.md#writing-to-a-slow-loxilb): a Service that
//! says `Queued` tells how far back it is; this tells the whole queue.

use serde::{Deserialize, Serialize};

use super::Instance;

/// How many waiting Services one loxilb's report names (the nearest to their turn).
pub const SERVICES_SHOWN: usize = 10;

/// The `/queues` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Queues {
    /// `leader` or `standby`: only the leader writes, so only its queues hold anything.
    pub role: String,
    pub loxilbs: Vec<WriteQueue>,
}

/// One loxilb's write window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteQueue {
    pub url: String,
    pub group: String,
    pub healthy: bool,
    /// Writes waiting for their turn.
    pub waiting: usize,
    pub in_flight: usize,
    /// The most writes in flight it takes now (the window adapts to its answers).
    pub window: usize,
    pub oldest_seconds: Option<f64>,
    /// What one write costs there, as learnt from its answers.
    pub per_write_seconds: Option<f64>,
    /// Waiting writes dropped unsent because a newer one for the same rule came.
    pub superseded: u64,
    /// The Services whose writes wait, nearest to their turn first.
    pub services: Vec<QueuedService>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedService {
    /// `namespace/name`.
    pub service: String,
    /// Writes that go before its first one.
    pub ahead: usize,
    pub estimate_seconds: Option<f64>,
}

impl Instance {
    /// Its write window now.
    pub fn write_queue(&self) -> WriteQueue {
        let view = self.window.view();
        WriteQueue {
            url: self.url().to_string(),
            group: self.group().to_string(),
            healthy: self.is_healthy(),
            waiting: view.depth,
            in_flight: view.in_flight,
            window: view.limit,
            oldest_seconds: view.oldest.map(|d| d.as_secs_f64()),
            per_write_seconds: view.per_write.map(|d| d.as_secs_f64()),
            superseded: view.superseded,
            services: self
                .window
                .waiting_owners(SERVICES_SHOWN)
                .into_iter()
                .map(|(service, p)| QueuedService {
                    service,
                    ahead: p.ahead,
                    estimate_seconds: p.estimate.map(|d| d.as_secs_f64()),
                })
                .collect(),
        }
    }
}

impl WriteQueue {
    /// One line for people: `12 write(s) waiting (oldest 3.2 s), 2 in flight of 2, about
    /// 14 s to drain at 1.00 s per write; next: default/web (0 ahead), …`.
    pub fn describe(&self) -> String {
        if self.waiting == 0 && self.in_flight == 0 {
            let cost = self
                .per_write_seconds
                .map(|s| format!(" ({s:.2} s per write)"))
                .unwrap_or_default();
            return format!("no write waiting{cost}");
        }
        let mut text = format!("{} write(s) waiting", self.waiting);
        if let Some(oldest) = self.oldest_seconds {
            text.push_str(&format!(" (oldest {oldest:.1} s)"));
        }
        text.push_str(&format!(
            ", {} in flight of {}",
            self.in_flight, self.window
        ));
        if let Some(per) = self.per_write_seconds {
            let drain = per * (self.waiting + self.in_flight) as f64;
            text.push_str(&format!(
                ", about {} s to drain at {per:.2} s per write",
                drain.ceil()
            ));
        }
        if !self.services.is_empty() {
            let next: Vec<String> = self
                .services
                .iter()
                .map(|s| format!("{} ({} ahead)", s.service, s.ahead))
                .collect();
            text.push_str(&format!("; next: {}", next.join(", ")));
            if self.services.len() == SERVICES_SHOWN {
                text.push_str(", …");
            }
        }
        if self.superseded > 0 {
            text.push_str(&format!(
                "; {} superseded write(s) dropped unsent",
                self.superseded
            ));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> WriteQueue {
        WriteQueue {
            url: "http://l1:11111".into(),
            group: "default".into(),
            healthy: true,
            waiting: 0,
            in_flight: 0,
            window: 1,
            oldest_seconds: None,
            per_write_seconds: None,
            superseded: 0,
            services: vec![],
        }
    }

    #[test]
    fn an_idle_and_a_busy_queue_read_as_sentences() {
        assert_eq!(queue().describe(), "no write waiting");
        let busy = WriteQueue {
            waiting: 12,
            in_flight: 2,
            window: 2,
            oldest_seconds: Some(3.24),
            per_write_seconds: Some(1.0),
            superseded: 3,
            services: vec![QueuedService {
                service: "default/web".into(),
                ahead: 2,
                estimate_seconds: Some(3.0),
            }],
            ..queue()
        };
        assert_eq!(
            busy.describe(),
            "12 write(s) waiting (oldest 3.2 s), 2 in flight of 2, about 14 s to drain at \
             1.00 s per write; next: default/web (2 ahead); 3 superseded write(s) dropped unsent"
        );
    }

    #[test]
    fn the_document_round_trips_in_camel_case() {
        let doc = Queues {
            role: "leader".into(),
            loxilbs: vec![queue()],
        };
        let text = serde_json::to_string(&doc).unwrap();
        assert!(text.contains("\"inFlight\":0"), "{text}");
        assert_eq!(serde_json::from_str::<Queues>(&text).unwrap(), doc);
    }
}
