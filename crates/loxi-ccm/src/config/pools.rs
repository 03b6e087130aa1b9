//! The address pools (`PoolArgs`): parsed, named, checked for overlaps, each refusal naming
//! the option (and layer) the block came from.

use loxi_domain::Pool;
use loxi_domain::ipam::{AddressBlock, Family};
use loxi_domain::text::shown;

use crate::config::cli::PoolArgs;
use crate::config::origins::Origins;
use crate::config::{ConfigError, DEFAULT_POOL, DEFAULT_POOL6};

/// One block of one pool, with the text and the source it came from (for messages).
struct BlockEntry {
    pool: String,
    block: AddressBlock,
    origin: String,
}

fn non_empty(items: &[String]) -> impl Iterator<Item = &str> {
    items.iter().map(|s| s.trim()).filter(|s| !s.is_empty())
}

fn valid_pool_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 63
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Parses one block of the expected family; `value` is the text as given (for messages).
fn parse_block(
    origins: &Origins,
    id: &str,
    value: &str,
    block_text: &str,
    family: Family,
    other_family_hint: &str,
) -> Result<AddressBlock, ConfigError> {
    let origin = origins.describe(id);
    let block: AddressBlock = block_text
        .parse()
        .map_err(|e: loxi_domain::ipam::BlockError| {
            ConfigError::invalid(
                &origin,
                format!("invalid value {}: {}", shown(value), e.reason),
            )
        })?;
    if block.family() != family {
        return Err(ConfigError::invalid(
            &origin,
            format!(
                "invalid value {}: {block_text} is {}; {} blocks go in {other_family_hint}",
                shown(value),
                block.family(),
                block.family()
            ),
        ));
    }
    Ok(block)
}

/// `name=block` of --cidr-pools / --cidr6-pools.
fn named_block(
    origins: &Origins,
    id: &str,
    item: &str,
    family: Family,
    other_family_hint: &str,
) -> Result<BlockEntry, ConfigError> {
    let origin = origins.describe(id);
    let Some((name, text)) = item.split_once('=') else {
        return Err(ConfigError::invalid(
            &origin,
            format!(
                "invalid value {}: expected <pool name>=<CIDR or range>",
                shown(item)
            ),
        ));
    };
    let name = name.trim();
    if !valid_pool_name(name) {
        return Err(ConfigError::invalid(
            &origin,
            format!(
                "invalid value {}: pool name {} must be 1-63 letters, digits, '-', '_' or \
                 '.', starting with a letter or digit",
                shown(item),
                shown(name)
            ),
        ));
    }
    let block = parse_block(origins, id, item, text.trim(), family, other_family_hint)?;
    Ok(BlockEntry {
        pool: name.to_string(),
        block,
        origin,
    })
}

/// Any two overlapping blocks (in different pools or in the same one) are an error naming
/// both.
fn check_overlaps(entries: &[&BlockEntry]) -> Result<(), ConfigError> {
    let mut spans: Vec<(Family, u128, u128, usize)> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let (first, last) = e.block.bounds();
            (e.block.family(), first, last, i)
        })
        .collect();
    spans.sort_by_key(|&(family, first, last, _)| (family == Family::V6, first, last));
    // The block reaching furthest so far, per family run.
    let mut reach: Option<(Family, u128, usize)> = None;
    for &(family, first, last, i) in &spans {
        if let Some((rf, rlast, ri)) = reach
            && rf == family
            && first <= rlast
        {
            let (a, b) = (entries[ri], entries[i]);
            return Err(ConfigError::Conflict(format!(
                "address blocks overlap: {} of pool {:?} ({}) and {} of pool {:?} ({})",
                a.block, a.pool, a.origin, b.block, b.pool, b.origin
            )));
        }
        if reach.is_none_or(|(rf, rlast, _)| rf != family || last > rlast) {
            reach = Some((family, last, i));
        }
    }
    Ok(())
}

/// The block of `--external-cidr` (pool "default") or `--external-cidr6` ("default6").
fn default_block(
    origins: &Origins,
    id: &str,
    text: &str,
    pool: &str,
    family: Family,
    other_family_hint: &str,
) -> Result<BlockEntry, ConfigError> {
    let block = parse_block(origins, id, text, text.trim(), family, other_family_hint)?;
    Ok(BlockEntry {
        pool: pool.to_string(),
        block,
        origin: origins.describe(id),
    })
}

/// The blocks of the primary pools, in priority order: `--external-cidr`, `--cidr-pools`,
/// `--external-cidr6`, `--cidr6-pools`.
fn primary_entries(args: &PoolArgs, origins: &Origins) -> Result<Vec<BlockEntry>, ConfigError> {
    let mut entries: Vec<BlockEntry> = Vec::new();
    if let Some(text) = &args.external_cidr {
        let hint = "--external-cidr6";
        entries.push(default_block(
            origins,
            "external_cidr",
            text,
            DEFAULT_POOL,
            Family::V4,
            hint,
        )?);
    }
    for item in non_empty(&args.cidr_pools) {
        entries.push(named_block(
            origins,
            "cidr_pools",
            item,
            Family::V4,
            "--cidr6-pools",
        )?);
    }
    if let Some(text) = &args.external_cidr6 {
        let hint = "--external-cidr";
        entries.push(default_block(
            origins,
            "external_cidr6",
            text,
            DEFAULT_POOL6,
            Family::V6,
            hint,
        )?);
    }
    for item in non_empty(&args.cidr6_pools) {
        entries.push(named_block(
            origins,
            "cidr6_pools",
            item,
            Family::V6,
            "--cidr-pools",
        )?);
    }
    if entries.is_empty() {
        return Err(ConfigError::Conflict(
            "no address pool: set --external-cidr, --external-cidr6, --cidr-pools or \
             --cidr6-pools (or their LOXI_CCM_* variables or config keys)"
                .to_string(),
        ));
    }
    Ok(entries)
}

/// The blocks of `--external-secondary-cidrs`, one pool each (`secondary0`, ...).
fn secondary_entries(args: &PoolArgs, origins: &Origins) -> Result<Vec<BlockEntry>, ConfigError> {
    let id = "external_secondary_cidrs";
    let hint = "no option yet (IPv6 secondary pools are not supported)";
    non_empty(&args.external_secondary_cidrs)
        .enumerate()
        .map(|(i, text)| {
            Ok(BlockEntry {
                pool: loxi_domain::addressing::secondary_pool_name(i),
                block: parse_block(origins, id, text, text, Family::V4, hint)?,
                origin: origins.describe(id),
            })
        })
        .collect()
}

/// A secondary pool's name (`secondary0`, ...) taken by a primary pool is an error naming
/// both sources.
fn check_secondary_names(
    primary: &[BlockEntry],
    secondary: &[BlockEntry],
) -> Result<(), ConfigError> {
    let Some(clash) = secondary
        .iter()
        .find(|s| primary.iter().any(|e| e.pool == s.pool))
    else {
        return Ok(());
    };
    Err(ConfigError::Conflict(format!(
        "pool name {:?} is used by {} and by the secondary pools of {}: rename the pool",
        clash.pool,
        primary
            .iter()
            .find(|e| e.pool == clash.pool)
            .map(|e| e.origin.as_str())
            .unwrap_or_default(),
        clash.origin
    )))
}

/// The primary pools (entries of one name merged, in order) and the secondary pools.
pub(super) fn build_pools(
    args: &PoolArgs,
    origins: &Origins,
) -> Result<(Vec<Pool>, Vec<Pool>), ConfigError> {
    let entries = primary_entries(args, origins)?;
    let secondary = secondary_entries(args, origins)?;
    let all: Vec<&BlockEntry> = entries.iter().chain(&secondary).collect();
    check_overlaps(&all)?;
    check_secondary_names(&entries, &secondary)?;

    let mut pools: Vec<Pool> = Vec::new();
    for e in entries {
        match pools.iter_mut().find(|p| p.name == e.pool) {
            Some(p) => p.blocks.push(e.block),
            None => pools.push(Pool::new(&e.pool, vec![e.block])),
        }
    }
    let secondary_pools = secondary
        .into_iter()
        .map(|e| Pool::new(&e.pool, vec![e.block]))
        .collect();
    Ok((pools, secondary_pools))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::run_args;

    fn pool_args(flags: &[&str]) -> PoolArgs {
        run_args(flags).pools
    }

    fn names(pools: &[Pool]) -> Vec<&str> {
        pools.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn pools_come_in_priority_order_and_one_name_merges_blocks() {
        let args = pool_args(&[
            "--external-cidr6=2001:db8::/120",
            "--cidr-pools=a=10.0.0.0/24,a=10.0.2.0/24,b=10.0.1.0/24",
            "--external-cidr=192.0.2.0/24",
            "--external-secondary-cidrs=10.9.0.0/24",
        ]);
        let (pools, secondary) = build_pools(&args, &Origins::default()).unwrap();
        assert_eq!(names(&pools), [DEFAULT_POOL, "a", "b", DEFAULT_POOL6]);
        assert_eq!(pools[1].blocks.len(), 2);
        assert_eq!(names(&secondary), ["secondary0"]);
    }

    #[test]
    fn no_pool_a_wrong_family_and_overlaps_are_refused() {
        let origins = Origins::default();
        let e = build_pools(&pool_args(&[]), &origins).unwrap_err();
        assert!(e.to_string().starts_with("no address pool"), "{e}");
        let v6_in_v4 = pool_args(&["--external-cidr=2001:db8::/120"]);
        let e = build_pools(&v6_in_v4, &origins).unwrap_err().to_string();
        assert!(
            e.starts_with("--external-cidr: ") && e.contains("--external-cidr6"),
            "{e}"
        );
        let overlap = pool_args(&["--external-cidr=10.0.0.0/16", "--cidr-pools=a=10.0.1.0/24"]);
        let e = build_pools(&overlap, &origins).unwrap_err().to_string();
        assert!(e.starts_with("address blocks overlap"), "{e}");
    }

    #[test]
    fn a_primary_pool_cannot_take_a_secondary_name() {
        let args = pool_args(&[
            "--cidr-pools=secondary0=10.0.0.0/24",
            "--external-secondary-cidrs=10.9.0.0/24",
        ]);
        let e = build_pools(&args, &Origins::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"secondary0\"") && e.contains("rename the pool"),
            "{e}"
        );
    }
}
