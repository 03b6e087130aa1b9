//! Reconcile triggers from a reflector's events, for `Controller::for_stream`, that never get
//! ahead of the reflector's store.
//!
//! kube's `applied_objects()` and `touched_objects()` yield every object of a re-list as it
//! arrives (`InitApply`), but the store swaps the re-listed objects in only at the end of the
//! list (`InitDone`). The controller looks a triggered object up in the store at once, so
//! during a re-list an object created while the watch was away is not there yet (kube drops
//! the trigger: "not found in local store"), and one changed meanwhile is still its old copy
//! (the reconcile sees the old state, and nothing triggers it again). Found by
//! `tests/fault_matrix.rs::apiserver_restart_under_load` with 200 Services: Services created
//! or deleted while the API server restarted were never reconciled. Here the objects of a
//! re-list are held back and yielded after `InitDone`, when the store has them; single
//! changes pass at once.

use futures::{Stream, StreamExt};
use kube::runtime::watcher;

/// The objects a watch applied (created or changed), each yielded once the store holds it.
pub fn applied_objects<K, E>(
    events: impl Stream<Item = Result<watcher::Event<K>, E>>,
) -> impl Stream<Item = Result<K, E>> {
    after_relist(events, false)
}

/// As [`applied_objects`], deleted objects included.
pub fn touched_objects<K, E>(
    events: impl Stream<Item = Result<watcher::Event<K>, E>>,
) -> impl Stream<Item = Result<K, E>> {
    after_relist(events, true)
}

fn after_relist<K, E>(
    events: impl Stream<Item = Result<watcher::Event<K>, E>>,
    deleted_too: bool,
) -> impl Stream<Item = Result<K, E>> {
    events
        .scan(Vec::new(), move |relisted: &mut Vec<K>, event| {
            let out: Vec<Result<K, E>> = match event {
                Ok(watcher::Event::Apply(obj)) => vec![Ok(obj)],
                Ok(watcher::Event::Delete(obj)) if deleted_too => vec![Ok(obj)],
                Ok(watcher::Event::Delete(_)) => Vec::new(),
                // A re-list that starts over (the previous one failed midway) lists everything
                // again.
                Ok(watcher::Event::Init) => {
                    relisted.clear();
                    Vec::new()
                }
                Ok(watcher::Event::InitApply(obj)) => {
                    relisted.push(obj);
                    Vec::new()
                }
                Ok(watcher::Event::InitDone) => {
                    std::mem::take(relisted).into_iter().map(Ok).collect()
                }
                Err(e) => vec![Err(e)],
            };
            futures::future::ready(Some(out))
        })
        .flat_map(futures::stream::iter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use watcher::Event;

    fn run(events: Vec<Result<Event<u32>, &'static str>>, touched: bool) -> Vec<String> {
        let stream = futures::stream::iter(events);
        let out: Vec<Result<u32, &str>> = futures::executor::block_on(if touched {
            touched_objects(stream).boxed().collect::<Vec<_>>()
        } else {
            applied_objects(stream).boxed().collect::<Vec<_>>()
        });
        out.into_iter()
            .map(|r| match r {
                Ok(n) => n.to_string(),
                Err(e) => e.to_string(),
            })
            .collect()
    }

    #[test]
    fn relisted_objects_come_after_the_list_ends() {
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(1)),
            Ok(Event::InitApply(2)),
            Ok(Event::InitDone),
            Ok(Event::Apply(3)),
            Ok(Event::Init),
            Ok(Event::InitApply(4)),
            Ok(Event::Apply(5)),
            Ok(Event::InitDone),
        ];
        // 5 is a change the watch saw during the list: yielded at once, as kube would.
        assert_eq!(run(events, false), ["1", "2", "3", "5", "4"]);
    }

    #[test]
    fn an_abandoned_relist_is_forgotten() {
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(1)),
            Err("watch failed"),
            Ok(Event::Init),
            Ok(Event::InitApply(2)),
            Ok(Event::InitDone),
        ];
        assert_eq!(run(events, false), ["watch failed", "2"]);
    }

    #[test]
    fn deletions_only_when_touched() {
        let events = vec![Ok(Event::Apply(1)), Ok(Event::Delete(2))];
        assert_eq!(run(events.clone(), false), ["1"]);
        assert_eq!(run(events, true), ["1", "2"]);
    }
}
