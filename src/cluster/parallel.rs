//! Running a pure function over a slice on up to a few cores (scoped threads): the first
//! list's application and the read snapshot's build. The parts' outputs come back in order.

/// `work` over `items` split into up to `threads` parts (no more than the cores), one scoped
/// thread per part after the first, which runs here; the parts' outputs in order.
pub(super) fn on_cores<I: Sync, O: Send>(
    items: &[I],
    threads: usize,
    work: impl Fn(&[I]) -> Vec<O> + Sync,
) -> Vec<O> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(threads);
    if threads <= 1 || items.len() < 2 {
        return work(items);
    }
    let chunk = items.len().div_ceil(threads);
    let work = &work;
    std::thread::scope(|scope| {
        let workers: Vec<_> = items
            .chunks(chunk)
            .skip(1)
            .map(|part| scope.spawn(move || work(part)))
            .collect();
        let mut out = work(&items[..chunk]);
        for w in workers {
            match w.join() {
                Ok(part) => out.extend(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}
