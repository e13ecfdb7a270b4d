//! Tokens of the expression language.

use super::error::ParseError;

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Int(i64),
    Float(f64),
    Str(String),
    Ident(String),
    /// `#`, `#index`, `#acc`.
    Pointer(String),
    /// Operators and punctuation, by their spelling.
    Sym(&'static str),
    Eof,
}

const SYMS: &[&str] = &[
    "?.", "??", "**", "==", "!=", "<=", ">=", "&&", "||", "..", "+", "-", "*", "/", "%", "^", "<",
    ">", "!", "|", "?", ":", ",", ";", ".", "(", ")", "[", "]", "{", "}", "=",
];

/// Splits `src` into tokens with their byte offsets; comments are skipped.
pub fn lex(src: &str) -> Result<Vec<(Tok, usize)>, ParseError> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if src[i..].starts_with("//") {
            i = src[i..].find('\n').map_or(b.len(), |n| i + n);
            continue;
        }
        if src[i..].starts_with("/*") {
            match src[i + 2..].find("*/") {
                Some(n) => i += n + 4,
                None => return Err(ParseError { message: "unterminated /* comment".into(), pos: i }),
            }
            continue;
        }
        let start = i;
        if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'_') {
                i += 1;
            }
            let mut float = false;
            if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
                float = true;
                i += 1;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
                float = true;
                i += 1;
                if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
                    i += 1;
                }
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let text: String = src[start..i].chars().filter(|c| *c != '_').collect();
            let tok = if float {
                Tok::Float(text.parse().map_err(|_| ParseError { message: format!("bad number {text}"), pos: start })?)
            } else {
                Tok::Int(text.parse().map_err(|_| ParseError { message: format!("number {text} is too large"), pos: start })?)
            };
            out.push((tok, start));
            continue;
        }
        if c == b'"' || c == b'\'' {
            let (s, end) = string(src, i)?;
            out.push((Tok::Str(s), start));
            i = end;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' || c == b'$' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'$') {
                i += 1;
            }
            out.push((Tok::Ident(src[start..i].to_string()), start));
            continue;
        }
        if c == b'#' {
            i += 1;
            while i < b.len() && b[i].is_ascii_alphanumeric() {
                i += 1;
            }
            let name = &src[start..i];
            if !matches!(name, "#" | "#index" | "#acc") {
                return Err(ParseError { message: format!("unknown pointer {name} (# is the current element; #index and #acc also exist; # is not a comment here, use //)"), pos: start });
            }
            out.push((Tok::Pointer(name.to_string()), start));
            continue;
        }
        match SYMS.iter().find(|s| src[i..].starts_with(**s)) {
            Some(s) => {
                out.push((Tok::Sym(s), start));
                i += s.len();
            }
            None => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(ParseError { message: format!("unexpected character {ch:?}"), pos: i });
            }
        }
    }
    out.push((Tok::Eof, b.len()));
    Ok(out)
}

fn string(src: &str, start: usize) -> Result<(String, usize), ParseError> {
    let quote = src.as_bytes()[start] as char;
    let mut out = String::new();
    let mut chars = src[start + 1..].char_indices();
    while let Some((off, c)) = chars.next() {
        match c {
            c if c == quote => return Ok((out, start + 1 + off + 1)),
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, 't')) => out.push('\t'),
                Some((_, 'r')) => out.push('\r'),
                Some((_, '0')) => out.push('\0'),
                Some((off2, 'u')) => {
                    let hex: String = src[start + 1 + off2 + 1..].chars().take(4).collect();
                    let cp = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).ok_or(ParseError {
                        message: "bad \\u escape".into(),
                        pos: start + 1 + off2,
                    })?;
                    out.push(cp);
                    for _ in 0..4 {
                        chars.next();
                    }
                }
                Some((_, other)) => out.push(other),
                None => break,
            },
            c => out.push(c),
        }
    }
    Err(ParseError { message: "unterminated string".into(), pos: start })
}
