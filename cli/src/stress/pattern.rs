//! What every byte of a buffer should hold: patterns derived from the
//! buffer's id and a write serial, tracked through writes, fills and
//! copies, and checked against what a read returns.

use cistern_memory::rng::mix;

/// The content a write or fill put somewhere, as a function of position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Not known: freshly reserved, or a transfer into it failed. Never checked.
    Unknown,
    /// Pseudo-random bytes of a host write.
    Written {
        /// Derived from the buffer and the write serial.
        key: u64,
    },
    /// One `f32`, repeated, of a fill kernel.
    Filled {
        /// The value's bits.
        bits: u32,
    },
}

impl Pattern {
    /// The pattern of write number `serial` into buffer `buffer`.
    pub fn written(buffer: u64, serial: u64) -> Pattern {
        Pattern::Written {
            key: mix(buffer ^ mix(serial ^ 0xA5A5_5A5A_0F0F_F0F0)),
        }
    }

    /// The pattern (and its value) of fill number `serial` into `buffer`:
    /// a finite `f32`, so no path may canonicalize it.
    pub fn filled(buffer: u64, serial: u64) -> (Pattern, f32) {
        // Clearing the sign and the exponent's low bit keeps the exponent
        // below all-ones: never an infinity or a NaN.
        let bits = (mix(buffer.rotate_left(17) ^ serial) as u32) & 0x7F7F_FFFF;
        (Pattern::Filled { bits }, f32::from_bits(bits))
    }

    /// Writes the pattern's bytes at pattern positions `position..` into `out`.
    /// `Unknown` writes zeros.
    pub fn render_into(self, position: u64, out: &mut [u8]) {
        match self {
            Pattern::Unknown => out.fill(0),
            Pattern::Filled { bits } => {
                let value = bits.to_ne_bytes();
                for (i, byte) in out.iter_mut().enumerate() {
                    *byte = value[(position.wrapping_add(i as u64) % 4) as usize];
                }
            }
            Pattern::Written { key } => {
                let mut i = 0usize;
                while i < out.len() {
                    let at = position.wrapping_add(i as u64);
                    let word = written_word(key, at / 8).to_le_bytes();
                    let from = (at % 8) as usize;
                    let take = (8 - from).min(out.len() - i);
                    out[i..i + take].copy_from_slice(&word[from..from + take]);
                    i += take;
                }
            }
        }
    }

    /// `len` bytes of the pattern from pattern position `position`.
    pub fn render(self, position: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.render_into(position, &mut out);
        out
    }
}

fn written_word(key: u64, index: u64) -> u64 {
    mix(key ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// A run of bytes `[start, end)` holding `pattern` at positions `byte + shift`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    start: u64,
    end: u64,
    pattern: Pattern,
    /// Added (wrapping) to a byte's offset to get its pattern position:
    /// a copy moves bytes without changing what they are.
    shift: u64,
}

/// The first byte a read got wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Its offset in the buffer.
    pub offset: u64,
    /// What it should hold.
    pub expected: u8,
    /// What the read returned.
    pub found: u8,
}

/// What a buffer of `size` bytes should hold, byte range by byte range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    size: u64,
    /// Sorted, disjoint, covering `[0, size)`.
    segments: Vec<Segment>,
}

impl Expected {
    /// A fresh buffer: nothing known.
    pub fn unknown(size: u64) -> Self {
        Expected {
            size,
            segments: vec![Segment {
                start: 0,
                end: size,
                pattern: Pattern::Unknown,
                shift: 0,
            }],
        }
    }

    /// Bytes `[offset, offset + len)` now hold `pattern` at their own offsets.
    pub fn overlay(&mut self, offset: u64, len: u64, pattern: Pattern) {
        self.place(offset, len, pattern, 0);
    }

    /// Bytes `[offset, offset + len)` are no longer known (a failed transfer).
    pub fn forget(&mut self, offset: u64, len: u64) {
        self.place(offset, len, Pattern::Unknown, 0);
    }

    /// Bytes `[target_offset, target_offset + len)` now hold what `source`
    /// holds at `[source_offset, source_offset + len)`.
    pub fn copy_from(
        &mut self,
        source: &Expected,
        source_offset: u64,
        target_offset: u64,
        len: u64,
    ) {
        let end = source_offset + len;
        let moved: Vec<Segment> = source
            .segments
            .iter()
            .filter(|s| s.start < end && s.end > source_offset)
            .map(|s| {
                let start = s.start.max(source_offset);
                let stop = s.end.min(end);
                Segment {
                    start: start - source_offset + target_offset,
                    end: stop - source_offset + target_offset,
                    pattern: s.pattern,
                    // target byte t came from source byte t - target_offset + source_offset.
                    shift: s
                        .shift
                        .wrapping_add(source_offset)
                        .wrapping_sub(target_offset),
                }
            })
            .collect();
        for segment in moved {
            self.place(
                segment.start,
                segment.end - segment.start,
                segment.pattern,
                segment.shift,
            );
        }
    }

    /// Checks `bytes`, read at `offset`, against every known byte there;
    /// returns how many bytes were known (and matched).
    pub fn verify(&self, offset: u64, bytes: &[u8]) -> Result<u64, Mismatch> {
        let end = offset + bytes.len() as u64;
        let mut checked = 0u64;
        let mut scratch = Vec::new();
        for segment in &self.segments {
            if segment.end <= offset || segment.start >= end || segment.pattern == Pattern::Unknown
            {
                continue;
            }
            let start = segment.start.max(offset);
            let stop = segment.end.min(end);
            let got = &bytes[(start - offset) as usize..(stop - offset) as usize];
            scratch.resize(got.len(), 0);
            segment
                .pattern
                .render_into(start.wrapping_add(segment.shift), &mut scratch);
            if let Some(i) = got.iter().zip(&scratch).position(|(a, b)| a != b) {
                return Err(Mismatch {
                    offset: start + i as u64,
                    expected: scratch[i],
                    found: got[i],
                });
            }
            checked += got.len() as u64;
        }
        Ok(checked)
    }

    /// How many runs of distinct content the buffer holds (bounded by its writes).
    #[cfg(test)]
    pub fn runs(&self) -> usize {
        self.segments.len()
    }

    fn place(&mut self, offset: u64, len: u64, pattern: Pattern, shift: u64) {
        let end = (offset + len).min(self.size);
        if offset >= end {
            return;
        }
        let mut kept = Vec::with_capacity(self.segments.len() + 2);
        let mut inserted = false;
        for s in &self.segments {
            if s.end <= offset || s.start >= end {
                if !inserted && s.start >= end {
                    push_merged(
                        &mut kept,
                        Segment {
                            start: offset,
                            end,
                            pattern,
                            shift,
                        },
                    );
                    inserted = true;
                }
                push_merged(&mut kept, *s);
                continue;
            }
            if s.start < offset {
                push_merged(&mut kept, Segment { end: offset, ..*s });
            }
            if !inserted {
                push_merged(
                    &mut kept,
                    Segment {
                        start: offset,
                        end,
                        pattern,
                        shift,
                    },
                );
                inserted = true;
            }
            if s.end > end {
                push_merged(&mut kept, Segment { start: end, ..*s });
            }
        }
        if !inserted {
            push_merged(
                &mut kept,
                Segment {
                    start: offset,
                    end,
                    pattern,
                    shift,
                },
            );
        }
        self.segments = kept;
        debug_assert!(self.is_tiling());
    }

    fn is_tiling(&self) -> bool {
        self.segments.first().is_some_and(|s| s.start == 0)
            && self.segments.last().is_some_and(|s| s.end == self.size)
            && self.segments.windows(2).all(|w| w[0].end == w[1].start)
            && self.segments.iter().all(|s| s.start < s.end)
    }
}

/// Appends `segment`, merging it into the last one when it continues it.
fn push_merged(segments: &mut Vec<Segment>, segment: Segment) {
    if let Some(last) = segments.last_mut() {
        let continues = last.end == segment.start
            && last.pattern == segment.pattern
            && (last.shift == segment.shift || last.pattern == Pattern::Unknown);
        if continues {
            last.end = segment.end;
            return;
        }
    }
    segments.push(segment);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn simulate(expected: &Expected, memory: &[u8]) -> Result<u64, Mismatch> {
        expected.verify(0, memory)
    }

    #[test]
    fn a_written_pattern_reads_back_clean() {
        let mut expected = Expected::unknown(100);
        let pattern = Pattern::written(7, 1);
        let data = pattern.render(10, 50);
        expected.overlay(10, 50, pattern);
        let mut memory = vec![0xEEu8; 100];
        memory[10..60].copy_from_slice(&data);
        assert_eq!(simulate(&expected, &memory), Ok(50));
        assert_eq!(expected.verify(20, &memory[20..30]), Ok(10));
    }

    #[test]
    fn a_flipped_byte_is_caught_at_its_offset() {
        let mut expected = Expected::unknown(64);
        let pattern = Pattern::written(3, 9);
        expected.overlay(0, 64, pattern);
        let mut memory = pattern.render(0, 64);
        memory[37] ^= 0x01;
        assert_eq!(
            simulate(&expected, &memory),
            Err(Mismatch {
                offset: 37,
                expected: memory[37] ^ 0x01,
                found: memory[37],
            })
        );
    }

    #[test]
    fn another_buffers_or_an_older_writes_data_is_caught() {
        let mut expected = Expected::unknown(32);
        expected.overlay(0, 32, Pattern::written(1, 2));
        assert!(simulate(&expected, &Pattern::written(1, 1).render(0, 32)).is_err());
        assert!(simulate(&expected, &Pattern::written(2, 2).render(0, 32)).is_err());
    }

    #[test]
    fn a_fill_is_its_value_repeated() {
        let (pattern, value) = Pattern::filled(5, 4);
        assert!(value.is_finite());
        let mut expected = Expected::unknown(16);
        expected.overlay(4, 8, pattern);
        let mut memory = vec![0u8; 16];
        memory[4..8].copy_from_slice(&value.to_ne_bytes());
        memory[8..12].copy_from_slice(&value.to_ne_bytes());
        assert_eq!(simulate(&expected, &memory), Ok(8));
        memory[9] ^= 0x80;
        assert!(simulate(&expected, &memory).is_err());
    }

    #[test]
    fn a_copy_carries_the_source_content_to_another_offset() {
        let pattern = Pattern::written(11, 1);
        let mut source = Expected::unknown(40);
        source.overlay(0, 40, pattern);
        let source_memory = pattern.render(0, 40);
        let mut target = Expected::unknown(30);
        target.copy_from(&source, 13, 5, 20);
        let mut target_memory = vec![0u8; 30];
        target_memory[5..25].copy_from_slice(&source_memory[13..33]);
        assert_eq!(simulate(&target, &target_memory), Ok(20));
        // A copy from the wrong offset is caught.
        target_memory[5..25].copy_from_slice(&source_memory[12..32]);
        assert!(simulate(&target, &target_memory).is_err());
    }

    #[test]
    fn overlays_keep_the_buffer_tiled_and_merge_neighbours() {
        let mut expected = Expected::unknown(100);
        let pattern = Pattern::written(1, 1);
        expected.overlay(10, 10, pattern);
        expected.overlay(20, 10, pattern);
        expected.overlay(0, 5, Pattern::written(1, 2));
        expected.forget(90, 50);
        assert!(expected.is_tiling());
        // [0,5) write 2, [5,10) unknown, [10,30) write 1, [30,90) and [90,100) unknown merged.
        assert_eq!(expected.runs(), 4);
        expected.overlay(0, 100, pattern);
        assert_eq!(expected.runs(), 1);
    }

    #[test]
    fn unknown_bytes_are_never_checked() {
        let expected = Expected::unknown(8);
        assert_eq!(simulate(&expected, &[1, 2, 3, 4, 5, 6, 7, 8]), Ok(0));
    }
}
