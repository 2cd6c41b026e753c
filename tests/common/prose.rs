//! English-like text for the store's size measurements: each reply a different walk of an
//! order-2 word-level Markov chain over the project's book (docs/src, every chapter in path
//! order), the next word drawn among those that follow the last two in the book, by a small
//! PRNG seeded by the call's number. Unlike windows of the book, the replies do not repeat
//! each other's passages: what they share is the book's words and phrasing, as answers of
//! one model to one kind of task do. `tests/store_size.rs` and the bench's section 12
//! (`host/benches/factory.rs`, which includes this file by path) measure the same replies.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The chain: the book's words and what follows each pair of them.
pub struct Markov {
    /// The book's words, each an index in `vocabulary`.
    words: Vec<u32>,
    vocabulary: Vec<String>,
    /// (word, next word) -> the words that follow them in the book.
    next: HashMap<(u32, u32), Vec<u32>>,
}

/// xorshift64*: a fixed-seed PRNG, enough for drawing words.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng((seed ^ 0x2545_f491_4f6c_dd1d).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

impl Markov {
    /// The chain over the book under `root/docs/src`, or what could not be read.
    pub fn of_book(root: &Path) -> Result<Markov, String> {
        fn chapters(dir: &Path, into: &mut Vec<PathBuf>) -> Result<(), String> {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| format!("reading {}: {e}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            entries.sort();
            for path in entries {
                if path.is_dir() {
                    chapters(&path, into)?;
                } else if path.extension().is_some_and(|e| e == "md") {
                    into.push(path);
                }
            }
            Ok(())
        }
        let mut files = Vec::new();
        chapters(&root.join("docs").join("src"), &mut files)?;
        let mut index: HashMap<String, u32> = HashMap::new();
        let mut vocabulary = Vec::new();
        let mut words = Vec::new();
        for file in files {
            let chapter =
                std::fs::read_to_string(&file).map_err(|e| format!("reading the chapter {}: {e}", file.display()))?;
            for word in chapter.split_whitespace() {
                let id = *index.entry(word.to_string()).or_insert_with(|| {
                    vocabulary.push(word.to_string());
                    vocabulary.len() as u32 - 1
                });
                words.push(id);
            }
        }
        if words.len() < 1000 {
            return Err(format!("the book (docs/src) has {} words: too few for the replies' text", words.len()));
        }
        let mut next: HashMap<(u32, u32), Vec<u32>> = HashMap::new();
        for w in words.windows(3) {
            next.entry((w[0], w[1])).or_default().push(w[2]);
        }
        Ok(Markov { words, vocabulary, next })
    }

    /// Reply `i` of the replies seeded `seed`: `bytes` of generated text at most, cut at a
    /// character boundary.
    pub fn reply(&self, i: u64, seed: u64, bytes: usize) -> String {
        let mut rng = Rng::new(i ^ seed.rotate_left(32));
        let mut out = String::with_capacity(bytes + 64);
        let start = |rng: &mut Rng| {
            let at = rng.below(self.words.len() - 2);
            (self.words[at], self.words[at + 1])
        };
        let (mut a, mut b) = start(&mut rng);
        out += &self.vocabulary[a as usize];
        while out.len() < bytes {
            out.push(' ');
            out += &self.vocabulary[b as usize];
            match self.next.get(&(a, b)) {
                Some(followers) => (a, b) = (b, followers[rng.below(followers.len())]),
                // The book's last two words: start again elsewhere.
                None => (a, b) = start(&mut rng),
            }
        }
        let mut end = bytes;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out
    }
}
