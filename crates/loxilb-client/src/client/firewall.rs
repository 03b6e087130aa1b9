//! loxilb's firewall calls (docs/loxilb-api.md#firewall).

use reqwest::{Method, StatusCode};

use super::{Answer, DeleteOutcome, LoxilbClient, WriteOutcome, body_mentions, success_body};
use crate::error::{ClientError, classify};
use crate::firewall::{FirewallEntry, FirewallList, FirewallMatch};

impl LoxilbClient {
    /// `GET /config/firewall/all`: every firewall rule but the ones loxilb makes itself for
    /// `allowedSources`, which it does not list.
    pub async fn list_firewall(&self) -> Result<Vec<FirewallEntry>, ClientError> {
        let url = self.url_of(&["config", "firewall", "all"])?;
        let list: FirewallList = self.get_json(url, "firewall rule list").await?;
        Ok(list.rules)
    }

    /// `POST /config/firewall`. A rule with the same match and preference already there
    /// (409 `fwrule-exists`) is [`WriteOutcome::AlreadyPresent`], whatever its action.
    pub async fn add_firewall_rule(
        &self,
        entry: &FirewallEntry,
    ) -> Result<WriteOutcome, ClientError> {
        let url = self.url_of(&["config", "firewall"])?;
        match self.send_url(Method::POST, url, Some(entry)).await? {
            Answer::Ok(bytes) => success_body(&bytes).map(|()| WriteOutcome::Applied),
            Answer::Status(StatusCode::CONFLICT, body) if body_mentions(&body, "exist") => {
                Ok(WriteOutcome::AlreadyPresent)
            }
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    /// `DELETE /config/firewall?<the match and preference>`; an unknown rule (404
    /// `no-rule`) is [`DeleteOutcome::AlreadyAbsent`].
    pub async fn delete_firewall_rule(
        &self,
        rule: &FirewallMatch,
    ) -> Result<DeleteOutcome, ClientError> {
        let mut url = self.url_of(&["config", "firewall"])?;
        url.query_pairs_mut().extend_pairs(rule.delete_query());
        match self.send_url::<()>(Method::DELETE, url, None).await? {
            Answer::Ok(bytes) => success_body(&bytes).map(|()| DeleteOutcome::Deleted),
            Answer::Status(StatusCode::NOT_FOUND, body)
                if body_mentions(&body, "no-rule") || body_mentions(&body, "not found") =>
            {
                Ok(DeleteOutcome::AlreadyAbsent)
            }
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }
}
