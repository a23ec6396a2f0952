//! Memory maintenance through the server: reclaim and compaction.

use cistern::client::ComputeClient;
use cistern::runtime::Device;

use super::common::{ok, open, open_paged};

pub fn compaction_moves_live_data_intact_and_handles_stay_valid(device: Device) {
    // Compaction moves slices between pages: pages only, also where the
    // device could map memory into one range.
    let client = open_paged(device);
    let size = 64u64 << 10;
    let pages = |client: &ComputeClient| ok(client.memory_stats(), "memory_stats").sliced_pages;
    // Fill one page and three quarters of a second, each buffer its own pattern.
    let mut first_page = Vec::new();
    let mut second_page = Vec::new();
    let mut pattern = 0u8;
    let mut upload = |client: &ComputeClient| {
        pattern = pattern.wrapping_add(1);
        (
            pattern,
            ok(client.upload(&vec![pattern; size as usize]), "upload"),
        )
    };
    while pages(&client) < 2 {
        first_page.push(upload(&client));
    }
    second_page.push(
        first_page
            .pop()
            .expect("the last upload opened the second page"),
    );
    let second_size = ok(client.memory_snapshot(), "memory_snapshot")
        .pages
        .iter()
        .map(|page| page.size)
        .max()
        .unwrap_or(0);
    while (second_page.len() as u64 + 1) * size * 4 <= second_size * 3 {
        second_page.push(upload(&client));
    }
    assert_eq!(pages(&client), 2);
    // Leave the first page nearly empty: it is worth evacuating.
    let kept = first_page.len() - 2;
    first_page.drain(..kept);
    ok(client.sync(client.default_stream()), "sync");
    let before = ok(client.memory_stats(), "memory_stats");
    let report = ok(client.compact(), "compact");
    let after = ok(client.memory_stats(), "memory_stats");
    assert_eq!(report.moved, 2, "the sparse page was evacuated");
    assert_eq!(after.relocations - before.relocations, report.moved);
    for (pattern, buffer) in first_page.iter().chain(&second_page) {
        let bytes = ok(client.download(buffer), "download");
        assert!(
            bytes.iter().all(|b| b == pattern),
            "buffer {pattern} intact"
        );
    }
}

pub fn reclaim_releases_empty_pages_and_memory_stays_usable(device: Device) {
    let client = open(device);
    let buffers: Vec<_> = (0..8)
        .map(|_| ok(client.reserve(1 << 20), "reserve"))
        .collect();
    drop(buffers);
    ok(client.sync(client.default_stream()), "sync");
    let released = ok(client.reclaim(), "reclaim");
    let stats = ok(client.memory_stats(), "memory_stats");
    assert!(released > 0);
    assert_eq!(stats.reserved_bytes, 0);
    let buffer = ok(client.upload_f32(&[4.0; 8]), "upload");
    assert_eq!(ok(client.download_f32(&buffer), "download"), vec![4.0; 8]);
}
