//! Stop strings matched on the text, across token boundaries: text that might be the start of
//! a stop string is held back until the next tokens tell, and a stop string is never emitted.

/// The generated text of one sequence, and how much of it has been handed out.
#[derive(Clone, Debug, Default)]
pub(crate) struct StopText {
    stops: Vec<String>,
    /// Everything generated, cut at a matched stop string.
    text: String,
    /// Bytes of `text` handed out by [`StopText::take_ready`].
    emitted: usize,
}

impl StopText {
    /// A matcher for `stops` (non-empty strings).
    pub fn new(stops: Vec<String>) -> Self {
        StopText { stops, text: String::new(), emitted: 0 }
    }

    /// Appends the text of the next token(s). Returns the stop string that now occurs (the
    /// earliest one in the text, the longest of those starting there), after cutting the text
    /// where it starts.
    pub fn push(&mut self, piece: &str) -> Option<String> {
        self.text.push_str(piece);
        // Held-back text is never longer than a stop string, so a match starts after `emitted`.
        let unsent = &self.text[self.emitted..];
        let (start, stop) = self
            .stops
            .iter()
            .filter_map(|stop| unsent.find(stop.as_str()).map(|at| (at, stop)))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())))?;
        let stop = stop.clone();
        self.text.truncate(self.emitted + start);
        Some(stop)
    }

    /// The text that can no longer become part of a stop string, not handed out before.
    pub fn take_ready(&mut self) -> String {
        let unsent = &self.text[self.emitted..];
        let held = (1..unsent.len().min(self.longest_stop()) + 1)
            .rev()
            .find(|&n| {
                unsent.is_char_boundary(unsent.len() - n)
                    && self.stops.iter().any(|stop| stop.starts_with(&unsent[unsent.len() - n..]))
            })
            .unwrap_or(0);
        let end = self.text.len() - held;
        let ready = self.text[self.emitted..end].to_string();
        self.emitted = end;
        ready
    }

    /// Everything not handed out yet: at the end of the sequence, held-back text is text.
    pub fn take_rest(&mut self) -> String {
        let rest = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        rest
    }

    /// All the text so far (cut at a matched stop string).
    pub fn text(&self) -> &str {
        &self.text
    }

    fn longest_stop(&self) -> usize {
        self.stops.iter().map(String::len).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut text = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for piece in pieces {
            if let Some(stop) = text.push(piece) {
                out.push_str(&text.take_rest());
                assert_eq!(out, text.text());
                return (out, Some(stop));
            }
            out.push_str(&text.take_ready());
        }
        out.push_str(&text.take_rest());
        (out, None)
    }

    #[test]
    fn a_stop_string_split_over_tokens_is_cut_and_never_emitted() {
        assert_eq!(run(&["END"], &["Hello E", "N", "D more"]), ("Hello ".into(), Some("END".into())));
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), Some("\n\n".into())));
        assert_eq!(run(&["xyz"], &["xyz"]), ("".into(), Some("xyz".into())));
    }

    #[test]
    fn held_back_text_is_released_when_it_cannot_match() {
        let mut text = StopText::new(vec!["END".into()]);
        assert_eq!(text.push("Hello EN"), None);
        assert_eq!(text.take_ready(), "Hello ");
        assert_eq!(text.push("X"), None);
        assert_eq!(text.take_ready(), "ENX");
        assert_eq!(text.push("E"), None);
        assert_eq!(text.take_ready(), "");
        assert_eq!(text.take_rest(), "E", "at the end, held text is text");
        assert_eq!(run(&["END"], &["EN"]), ("EN".into(), None));
    }

    #[test]
    fn the_earliest_match_wins_and_multibyte_text_is_cut_on_char_boundaries() {
        assert_eq!(run(&["bc", "ab"], &["xab", "c"]), ("x".into(), Some("ab".into())));
        assert_eq!(run(&["é!"], &["café", "?é", "!"]), ("café?".into(), Some("é!".into())));
        assert_eq!(run(&["日本"], &["今日", "本"]), ("今".into(), Some("日本".into())));
        assert_eq!(run(&[], &["plain"]), ("plain".into(), None));
    }
}
