//! The scale scenario (one run per `--n`): N Services created, churned and deleted against
//! loxi-ccm, its restart and a simulator wipe, then the same against the baseline; and the
//! memory run with many Services of which few are ours (`run_bulk`).

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use serde_json::{Value, json};

use crate::baseline::Baseline;
use crate::ccm::{self, Ccm};
use crate::cluster::{self, BenchNode, Tracker};
use crate::stats::{self, secs, summarize};
use crate::{Env, per, progress, summary_json, usage_json, wait_ready};

/// Waits until no Service of the tracker's namespace changed for `quiet`; returns how long
/// after the call the last change came.
async fn settle(tracker: &Tracker, quiet: Duration, timeout: Duration) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let last = tracker.last_change().filter(|t| *t > started);
        let since = last.map_or(started.elapsed(), |t| t.elapsed());
        if since >= quiet {
            return Ok(last.map_or(Duration::ZERO, |t| t - started));
        }
        if started.elapsed() > timeout {
            bail!("Services still changing after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls the tracker and the simulator together until every Service shows an IP and the
/// simulator holds `rules` rules; returns (all IPs seen, both true), measured from `t0`.
pub(crate) async fn wait_converged(
    env: &Env,
    tracker: &Tracker,
    n: usize,
    rules: usize,
    t0: Instant,
) -> Result<(Duration, Duration)> {
    let mut ips_at = None;
    let mut rules_at = None;
    loop {
        if ips_at.is_none() && tracker.with_ip() >= n {
            ips_at = Some(t0.elapsed());
        }
        if rules_at.is_none() && env.sim.rule_count().await? == rules {
            rules_at = Some(t0.elapsed());
        }
        if let (Some(i), Some(r)) = (ips_at, rules_at) {
            return Ok((i, i.max(r)));
        }
        if t0.elapsed() > env.timeout {
            bail!(
                "not converged after {:?}: {} of {n} Services have an IP, {} of {rules} rules",
                env.timeout,
                tracker.with_ip(),
                env.sim.rule_count().await?
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Deletes the Services and waits until the simulator holds no rule and every object is
/// gone; returns (rules gone, objects gone), measured from the first delete.
pub(crate) async fn teardown(
    env: &Env,
    api: &Api<Service>,
    names: &[String],
    tracker: &Tracker,
) -> Result<(Duration, Duration)> {
    let t0 = Instant::now();
    cluster::delete_all(api, names, env.args.create_concurrency).await?;
    let mut rules_at = None;
    let mut gone_at = None;
    let mut listed_at = Instant::now();
    loop {
        if rules_at.is_none() && env.sim.rule_count().await? == 0 {
            rules_at = Some(t0.elapsed());
        }
        if gone_at.is_none() && tracker.deleted() >= names.len() {
            gone_at = Some(t0.elapsed());
        }
        // Once a second after the rules are gone, ask the API server too: a watch that
        // stalls without an error (seen once: no Delete event at all) must not hang the run.
        if gone_at.is_none() && rules_at.is_some() && listed_at.elapsed() > Duration::from_secs(1) {
            listed_at = Instant::now();
            let left = api
                .list_metadata(&kube::api::ListParams::default().limit(1))
                .await?;
            if left.items.is_empty() {
                eprintln!(
                    "loxi-bench: teardown: the Service watch saw {} of {} deletions; objects gone by a list (1 s resolution)",
                    tracker.deleted(),
                    names.len()
                );
                gone_at = Some(t0.elapsed());
            }
        }
        if let (Some(r), Some(g)) = (rules_at, gone_at) {
            return Ok((r, g));
        }
        if t0.elapsed() > env.timeout {
            bail!(
                "teardown not done after {:?}: {} rules left, {} of {} objects gone",
                env.timeout,
                env.sim.rule_count().await?,
                tracker.deleted(),
                names.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// When the replay after a wipe at `t0` made progress.
pub(crate) struct Replay {
    /// The simulator's first API call after the wipe (its counter restarts at 0): the
    /// controller's probe that notices the restart; the baseline's first POST.
    pub noticed: Duration,
    pub first_rule: Duration,
    pub all: Duration,
}

/// Waits (after a wipe at `t0`) until the simulator holds `rules` rules again.
pub(crate) async fn wait_replay(env: &Env, rules: usize, t0: Instant) -> Result<Replay> {
    let mut noticed = None;
    let mut first = None;
    loop {
        if noticed.is_none() && env.sim.sim.request_count() > 0 {
            noticed = Some(t0.elapsed());
        }
        let c = env.sim.rule_count().await?;
        if c > 0 && first.is_none() {
            first = Some(t0.elapsed());
        }
        if c >= rules {
            let all = t0.elapsed();
            let first_rule = first.unwrap_or(all);
            return Ok(Replay {
                noticed: noticed.unwrap_or(first_rule).min(first_rule),
                first_rule,
                all,
            });
        }
        if t0.elapsed() > env.timeout {
            bail!("only {c} of {rules} rules back after {:?}", env.timeout);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub(crate) async fn run_n(env: &Env, n: usize, flips: usize, run: &mut Value) -> Result<()> {
    let args = &env.args;
    let total_rules = n * args.ports;
    let client = &env.client;

    // Controller start-up.
    let mut ccm = Ccm::spawn(&env.spec, &format!("n{n}-first"))?;
    let ready = wait_ready(&mut ccm, env.timeout).await?;
    run["startup_ready_s"] = json!(secs(ready));

    // 1. Burst.
    let ns = format!("burst-{n}");
    cluster::ensure_namespace(client, &ns).await?;
    let api = env.services(&ns);
    let tracker = Tracker::start(client, &ns).await?;
    let names = cluster::names("svc", n);
    let objects = names
        .iter()
        .map(|name| cluster::lb_service(name, args.ports))
        .collect::<Result<Vec<_>>>()?;
    let cpu0 = ccm.usage()?.cpu_s;
    let srv0 = env.server_cpu();
    progress(&format!("burst: creating {n} Services"));
    let t0 = Instant::now();
    let trace = args.trace.then(|| {
        let (tracker, sim, admin) = (tracker.clone(), env.sim.clone(), ccm.admin.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let text = match http.get(format!("http://{admin}/metrics")).send().await {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(_) => String::new(),
                };
                let r = |res: &str| {
                    ccm::metric_sum(&text, "loxi_ccm_reconciles_total", &[("result", res)])
                };
                eprintln!(
                    "trace {:>6.2}s  ips {:>5}  rules {:>5}  reconciles ok {:>6} err {:>4}",
                    t0.elapsed().as_secs_f64(),
                    tracker.with_ip(),
                    sim.rule_count().await.unwrap_or(0),
                    r("success"),
                    r("error")
                );
            }
        })
    });
    let created =
        cluster::create_burst(&api, objects, args.create_concurrency, Some(&tracker)).await?;
    let (ips, converged) = wait_converged(env, &tracker, n, total_rules, t0).await?;
    if let Some(t) = trace {
        t.abort();
    }
    let writes = tracker.changes();
    let lat = summarize(&tracker.latencies());
    let before = cluster::snapshot(&api).await?;
    let distinct: HashSet<&String> = before.values().filter_map(|s| s.ip.as_ref()).collect();
    let u = ccm.usage()?;
    run["burst"] = json!({
        "create_s": secs(created),
        "all_ips_s": secs(ips),
        "converged_s": secs(converged),
        "latency": summary_json(&lat),
        "distinct_ips": distinct.len(),
        "service_writes_per_service": per(writes, n),
        "ccm_cpu_s": stats::round((u.cpu_s - cpu0) * 1000.0) / 1000.0,
        "server_cpu_s": stats::round(env.server_cpu() - srv0),
    });
    progress(&format!(
        "burst: converged in {:.2} s (create {:.2} s), latency p50 {} ms p99 {} ms",
        converged.as_secs_f64(),
        created.as_secs_f64(),
        lat.p50_ms,
        lat.p99_ms
    ));

    // What one full listing of loxilb costs (the controller lists to compare counts).
    let list_t = Instant::now();
    let listing = env.sim.listing_bytes().await?;
    run["burst"]["loxilb_listing_bytes"] = json!(listing);
    run["burst"]["loxilb_listing_ms"] =
        json!(stats::round(list_t.elapsed().as_secs_f64() * 1000.0));

    // 4. loxilb restart: wipe and wait for the replay.
    let cpu0 = ccm.usage()?.cpu_s;
    let t0 = Instant::now();
    env.sim.sim.restart();
    let replay = wait_replay(env, total_rules, t0).await?;
    let (first, all) = (replay.first_rule, replay.all);
    let u = ccm.usage()?;
    run["replay"] = json!({
        "rules": total_rules,
        "total_s": secs(all),
        "noticed_s": secs(replay.noticed),
        "after_noticed_s": secs(all - replay.noticed),
        "first_rule_s": secs(first),
        "ccm_cpu_s": stats::round((u.cpu_s - cpu0) * 1000.0) / 1000.0,
        "requests": env.sim.sim.request_count(),
    });
    progress(&format!(
        "replay: {total_rules} rules back in {:.2} s (noticed after {:.2} s, first rule after {:.2} s)",
        all.as_secs_f64(),
        replay.noticed.as_secs_f64(),
        first.as_secs_f64()
    ));

    // 3. Endpoint churn.
    let snapshot_rules = env.sim.sim.rules().len();
    // What one poll costs the simulator (its lock is held that long).
    let query_t = Instant::now();
    let _ = env.sim.rules_with_endpoint(&env.nodes[0].ip.to_string());
    let query_ms = query_t.elapsed().as_secs_f64() * 1000.0;
    let base: HashMap<String, usize> = env
        .nodes
        .iter()
        .map(|node| {
            let ip = node.ip.to_string();
            let c = env.sim.rules_with_endpoint(&ip);
            (ip, c)
        })
        .collect();
    let candidates: Vec<&BenchNode> = env
        .nodes
        .iter()
        .filter(|node| base.get(&node.ip.to_string()).copied().unwrap_or(0) > 0)
        .collect();
    let mut all_samples = Vec::new();
    let mut first_samples = Vec::new();
    let mut rules_changed = Vec::new();
    let cpu0 = ccm.usage()?.cpu_s;
    let srv0 = env.server_cpu();
    let churn_started = Instant::now();
    let writes0 = tracker.changes();
    if candidates.is_empty() {
        bail!("no node is an endpoint of any rule");
    }
    progress(&format!("churn: {flips} node readiness flips"));
    for i in 0..flips {
        let node = candidates[(i / 2) % candidates.len()];
        let ready = i % 2 == 1;
        let ip = node.ip.to_string();
        let target = if ready { base[&ip] } else { 0 };
        let before_count = env.sim.rules_with_endpoint(&ip);
        let t0 = Instant::now();
        cluster::set_node_ready(client, &node.name, ready).await?;
        let mut first = None;
        loop {
            let c = env.sim.rules_with_endpoint(&ip);
            if first.is_none() && c != before_count {
                first = Some(t0.elapsed());
            }
            if c == target {
                break;
            }
            if t0.elapsed() > Duration::from_secs(120) {
                bail!(
                    "flip {i} of {}: {c} rules forward to it, want {target}",
                    node.name
                );
            }
            tokio::time::sleep(Duration::from_millis(args.churn_poll_ms)).await;
        }
        let done = t0.elapsed();
        all_samples.push(done);
        first_samples.push(first.unwrap_or(done));
        rules_changed.push(before_count.abs_diff(target));
    }
    let u = ccm.usage()?;
    // An odd count leaves the last flipped Node not ready: ready again (not measured) before
    // the Node deletions, whose targets are the counts taken with every Node ready. With more
    // Nodes than a rule's endpoint limit, which Nodes a rule picks depends on the whole set.
    if flips % 2 == 1 {
        let node = candidates[((flips - 1) / 2) % candidates.len()];
        let ip = node.ip.to_string();
        cluster::set_node_ready(client, &node.name, true).await?;
        let t0 = Instant::now();
        while env.sim.rules_with_endpoint(&ip) != base[&ip] {
            if t0.elapsed() > Duration::from_secs(120) {
                bail!("{} ready again: rules never followed", node.name);
            }
            tokio::time::sleep(Duration::from_millis(args.churn_poll_ms)).await;
        }
    }
    let churn = summarize(&all_samples);
    #[allow(clippy::cast_precision_loss)]
    let mean_changed =
        rules_changed.iter().sum::<usize>() as f64 / rules_changed.len().max(1) as f64;
    run["churn"] = json!({
        "flips": flips,
        "all_rules": summary_json(&churn),
        "first_rule": summary_json(&summarize(&first_samples)),
        "mean_rules_changed_per_flip": stats::round(mean_changed),
        "service_writes_per_flip": per(tracker.changes() - writes0, flips),
        "wall_s": secs(churn_started.elapsed()),
        "poll_ms": args.churn_poll_ms,
        "poll_query_ms": stats::round(query_ms),
        "rules_in_snapshot": snapshot_rules,
        "ccm_cpu_s": stats::round((u.cpu_s - cpu0) * 1000.0) / 1000.0,
        "server_cpu_s": stats::round(env.server_cpu() - srv0),
    });
    progress(&format!(
        "churn: p50 {} ms p99 {} ms max {} ms (~{mean_changed:.0} rules per flip)",
        churn.p50_ms, churn.p99_ms, churn.max_ms
    ));

    // 3b. Node deletions and re-creations: Nodes that were there when the controller
    // started (a deletion the Node watch once missed).
    let deletions = (flips / 5).max(2);
    progress(&format!(
        "churn: {deletions} node deletions and re-creations"
    ));
    let mut deleted_samples = Vec::new();
    let mut created_samples = Vec::new();
    for i in 0..deletions {
        let node = candidates[i % candidates.len()];
        let ip = node.ip.to_string();
        for (present, samples) in [(false, &mut deleted_samples), (true, &mut created_samples)] {
            let target = if present { base[&ip] } else { 0 };
            let t0 = Instant::now();
            if present {
                cluster::create_node(client, node).await?;
            } else {
                cluster::delete_node(client, &node.name).await?;
            }
            while env.sim.rules_with_endpoint(&ip) != target {
                if t0.elapsed() > Duration::from_secs(120) {
                    bail!(
                        "node {} {}: rules never followed",
                        node.name,
                        if present { "re-created" } else { "deleted" }
                    );
                }
                tokio::time::sleep(Duration::from_millis(args.churn_poll_ms)).await;
            }
            samples.push(t0.elapsed());
        }
    }
    let node_deleted = summarize(&deleted_samples);
    run["churn"]["node_deletions"] = json!(deletions);
    run["churn"]["node_deleted"] = summary_json(&node_deleted);
    run["churn"]["node_created"] = summary_json(&summarize(&created_samples));
    progress(&format!(
        "churn: node deleted -> rules p50 {} ms p99 {} ms",
        node_deleted.p50_ms, node_deleted.p99_ms
    ));

    // Trailing writes of the churn (status updates after the rules) must not count as
    // restart rewrites: wait for quiet first.
    let quiet = settle(&tracker, Duration::from_secs(2), env.timeout).await?;
    run["churn"]["writes_settled_after_last_flip_s"] = json!(secs(quiet));

    // 5. Controller restart.
    let first_counters = ccm.counters().await?;
    let before = cluster::snapshot(&api).await?;
    let first_usage = ccm.usage()?;
    let requests0 = env.sim.sim.request_count();
    let writes0 = tracker.changes();
    let t0 = Instant::now();
    let shutdown = ccm.stop().await?;
    let mut ccm = Ccm::spawn(&env.spec, &format!("n{n}-second"))?;
    let ready = t0.elapsed() + wait_ready(&mut ccm, env.timeout).await?;
    // Steady: every Service reconciled once, every rule present, and then no Service write
    // for QUIET; the steady time is the later of the first two and the last write seen.
    const QUIET: Duration = Duration::from_secs(3);
    let reconciled_at;
    #[allow(clippy::cast_precision_loss)]
    let n_f = n as f64;
    loop {
        let reconciled = ccm
            .metric("loxi_ccm_reconciles_total", &[("result", "success")])
            .await?;
        if reconciled >= n_f && env.sim.rule_count().await? == total_rules {
            reconciled_at = Instant::now();
            break;
        }
        if t0.elapsed() > env.timeout {
            bail!("loxi-ccm not steady {:?} after its restart", env.timeout);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let steady = loop {
        let last = tracker
            .last_change()
            .filter(|t| *t > t0)
            .map_or(reconciled_at, |t| t.max(reconciled_at));
        if last.elapsed() >= QUIET {
            break last - t0;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = cluster::snapshot(&api).await?;
    let address_changes = before
        .iter()
        .filter(|(name, s)| after.get(*name).map(|a| &a.ip) != Some(&s.ip))
        .count();
    let rewritten: Vec<&String> = before
        .iter()
        .filter(|(name, s)| {
            after.get(*name).map(|a| &a.resource_version) != Some(&s.resource_version)
        })
        .map(|(name, _)| name)
        .collect();
    // A few examples of what changed, from managedFields (manager, operation, time).
    let examples: Vec<Value> = rewritten
        .iter()
        .take(3)
        .map(|name| {
            json!({
                "service": name,
                "before": before[*name].managed,
                "after": after.get(*name).map(|a| a.managed.clone()),
                "conditions_before": before[*name].conditions,
                "conditions_after": after.get(*name).map(|a| a.conditions.clone()),
            })
        })
        .collect();
    let rewritten = rewritten.len();
    let writes = ccm
        .metric("loxi_ccm_loxilb_calls_total", &[("op", "apply")])
        .await?
        + ccm
            .metric("loxi_ccm_loxilb_calls_total", &[("op", "delete")])
            .await?;
    run["restart"] = json!({
        "shutdown_s": secs(shutdown),
        "ready_s": secs(ready),
        "steady_s": secs(steady),
        "address_changes": address_changes,
        "services_rewritten": rewritten,
        "loxilb_writes": writes,
        "loxilb_requests": env.sim.sim.request_count().saturating_sub(requests0),
        "service_writes": tracker.changes() - writes0,
        "rewritten_examples": examples,
    });
    progress(&format!(
        "restart: shutdown {:.2} s, ready {:.2} s, steady {:.2} s, {address_changes} address changes, {rewritten} Services rewritten",
        shutdown.as_secs_f64(),
        ready.as_secs_f64(),
        steady.as_secs_f64()
    ));

    // 6. Teardown.
    let cpu0 = ccm.usage()?.cpu_s;
    let srv0 = env.server_cpu();
    let (rules_gone, objects_gone) = teardown(env, &api, &names, &tracker).await?;
    let u = ccm.usage()?;
    run["teardown"] = json!({
        "rules_gone_s": secs(rules_gone),
        "objects_gone_s": secs(objects_gone),
        "total_s": secs(rules_gone.max(objects_gone)),
        "ccm_cpu_s": stats::round((u.cpu_s - cpu0) * 1000.0) / 1000.0,
        "server_cpu_s": stats::round(env.server_cpu() - srv0),
    });
    progress(&format!(
        "teardown: rules gone {:.2} s, objects gone {:.2} s",
        rules_gone.as_secs_f64(),
        objects_gone.as_secs_f64()
    ));
    drop(tracker);

    // 2. Steady rate.
    let ns = format!("steady-{n}");
    cluster::ensure_namespace(client, &ns).await?;
    let api = env.services(&ns);
    let tracker = Tracker::start(client, &ns).await?;
    let names = cluster::names("svc", n);
    let objects = names
        .iter()
        .map(|name| cluster::lb_service(name, args.ports))
        .collect::<Result<Vec<_>>>()?;
    progress(&format!("steady: {n} Services at {}/s", args.rate));
    let cpu0 = ccm.usage()?.cpu_s;
    let t0 = Instant::now();
    let created = cluster::create_at_rate(&api, objects, args.rate, &tracker).await?;
    let (_, converged) = wait_converged(env, &tracker, n, total_rules, t0).await?;
    let writes = tracker.changes();
    let lat = summarize(&tracker.latencies());
    let u = ccm.usage()?;
    let (r, o) = teardown(env, &api, &names, &tracker).await?;
    run["steady"] = json!({
        "rate_per_s": args.rate,
        "service_writes_per_service": per(writes, n),
        "create_s": secs(created),
        "converged_s": secs(converged),
        "latency": summary_json(&lat),
        "ccm_cpu_s": stats::round((u.cpu_s - cpu0) * 1000.0) / 1000.0,
        "teardown_s": secs(r.max(o)),
    });
    progress(&format!(
        "steady: latency p50 {} ms p99 {} ms max {} ms",
        lat.p50_ms, lat.p99_ms, lat.max_ms
    ));
    drop(tracker);

    // 7. Resources of both controller processes.
    let second_usage = ccm.usage()?;
    let second_counters = ccm.counters().await?;
    ccm.stop().await?;
    run["resources"] = json!({
        "first_process": usage_json(&first_usage),
        "second_process": usage_json(&second_usage),
        "peak_rss_mib": first_usage.peak_rss_mib().max(second_usage.peak_rss_mib()),
        "cpu_s": stats::round((first_usage.cpu_s + second_usage.cpu_s) * 1000.0) / 1000.0,
    });
    run["counters"] = json!({
        "first_process": first_counters,
        "second_process": second_counters,
    });

    // 8. Baseline.
    if !args.skip_baseline {
        run["baseline"] = run_baseline(env, n).await?;
        let ratio = |a: &Value, b: &Value| -> Value {
            match (a.as_f64(), b.as_f64()) {
                (Some(a), Some(b)) if b > 0.0 => json!((a / b * 100.0).round() / 100.0),
                _ => Value::Null,
            }
        };
        let ratios = json!({
            "burst": ratio(&run["burst"]["converged_s"], &run["baseline"]["burst_s"]),
            "replay": ratio(&run["replay"]["total_s"], &run["baseline"]["replay_s"]),
            "replay_after_noticed": ratio(&run["replay"]["after_noticed_s"], &run["baseline"]["replay_after_noticed_s"]),
            "teardown": ratio(&run["teardown"]["total_s"], &run["baseline"]["teardown_s"]),
            "teardown_rules_gone": ratio(&run["teardown"]["rules_gone_s"], &run["baseline"]["teardown_rules_gone_s"]),
        });
        run["ratio"] = ratios;
        progress(&format!("ratios loxi-ccm / baseline: {}", run["ratio"]));
    }
    Ok(())
}

async fn run_baseline(env: &Env, n: usize) -> Result<Value> {
    let args = &env.args;
    let total_rules = n * args.ports;
    let client = &env.client;
    let ns = format!("baseline-{n}");
    cluster::ensure_namespace(client, &ns).await?;
    let api = env.services(&ns);
    if env.sim.rule_count().await? != 0 {
        bail!("simulator not empty before the baseline");
    }
    let tracker = Tracker::start(client, &ns).await?;
    let node_ips = env.nodes.iter().map(|n| n.ip).collect();
    let base = Baseline::start(
        client,
        &ns,
        &env.sim.sim.url(),
        node_ips,
        Ipv4Addr::new(10, 201, 0, 1),
        args.baseline_concurrency,
    )?;
    let names = cluster::names("svc", n);
    let objects = names
        .iter()
        .map(|name| cluster::lb_service(name, args.ports))
        .collect::<Result<Vec<_>>>()?;
    progress(&format!("baseline: burst of {n}"));
    let srv0 = env.server_cpu();
    let t0 = Instant::now();
    let created =
        cluster::create_burst(&api, objects, args.create_concurrency, Some(&tracker)).await?;
    let (_, converged) = wait_converged(env, &tracker, n, total_rules, t0).await?;
    let server_cpu = env.server_cpu() - srv0;
    let writes = tracker.changes();
    let lat = summarize(&tracker.latencies());

    let t0 = Instant::now();
    env.sim.sim.restart();
    let replayed = base.replay().await?;
    let replay = wait_replay(env, total_rules, t0).await?;

    let (r, o) = teardown(env, &api, &names, &tracker).await?;
    let failures = base.failures();
    drop(base);
    progress(&format!(
        "baseline: burst {:.2} s, replay {:.2} s, teardown {:.2} s",
        converged.as_secs_f64(),
        replay.all.as_secs_f64(),
        r.max(o).as_secs_f64()
    ));
    Ok(json!({
        "burst_s": secs(converged),
        "burst_create_s": secs(created),
        "burst_server_cpu_s": stats::round(server_cpu),
        "burst_latency": summary_json(&lat),
        "service_writes_per_service": per(writes, n),
        "replay_s": secs(replay.all),
        // Told of the wipe, the baseline calls at once: its whole replay counts.
        "replay_after_noticed_s": secs(replay.all),
        "replayed_rules": replayed,
        "teardown_s": secs(r.max(o)),
        "teardown_rules_gone_s": secs(r),
        "failures": failures,
    }))
}

pub(crate) async fn run_bulk(env: &Env, total: usize, ours: usize, out: &mut Value) -> Result<()> {
    let client = &env.client;
    let others = total - ours;
    let ns = "bulk-clusterip";
    cluster::ensure_namespace(client, ns).await?;
    let api = env.services(ns);
    let objects = cluster::names("cip", others)
        .iter()
        .map(|name| cluster::cluster_ip_service(name))
        .collect::<Result<Vec<_>>>()?;
    progress(&format!("bulk: creating {others} ClusterIP Services"));
    let created = cluster::create_burst(&api, objects, env.args.create_concurrency, None).await?;
    out["clusterip_create_s"] = json!(secs(created));

    let mut ccm = Ccm::spawn(&env.spec, "bulk")?;
    let ready = wait_ready(&mut ccm, env.timeout).await?;
    let idle = ccm.usage()?;
    out["ready_s"] = json!(secs(ready));
    out["idle"] = usage_json(&idle);

    let ns = "bulk-lb";
    cluster::ensure_namespace(client, ns).await?;
    let api = env.services(ns);
    let tracker = Tracker::start(client, ns).await?;
    let objects = cluster::names("svc", ours)
        .iter()
        .map(|name| cluster::lb_service(name, env.args.ports))
        .collect::<Result<Vec<_>>>()?;
    progress(&format!("bulk: creating {ours} LoadBalancer Services"));
    let t0 = Instant::now();
    cluster::create_burst(&api, objects, env.args.create_concurrency, Some(&tracker)).await?;
    let (_, converged) = wait_converged(env, &tracker, ours, ours * env.args.ports, t0).await?;
    // Let allocations settle (drift/health loops) before reading the final numbers.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let u = ccm.usage()?;
    out["converged_s"] = json!(secs(converged));
    out["after"] = usage_json(&u);
    out["peak_rss_mib"] = json!(u.peak_rss_mib());
    progress(&format!(
        "bulk: converged in {:.2} s, peak RSS {} MiB (idle with {others} ClusterIP: {} MiB)",
        converged.as_secs_f64(),
        u.peak_rss_mib(),
        idle.peak_rss_mib()
    ));
    out["counters"] = ccm.counters().await?;
    ccm.stop().await?;
    Ok(())
}
