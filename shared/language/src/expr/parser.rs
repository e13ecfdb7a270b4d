//! A Pratt parser for the expression language.

use super::error::ParseError;
use super::lexer::{lex, Tok};

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Ident(String, usize),
    /// `#`, `#index`, `#acc` inside a predicate.
    Pointer(String),
    Array(Vec<Expr>),
    Map(Vec<(String, Expr)>),
    Member { target: Box<Expr>, name: String, optional: bool },
    Index { target: Box<Expr>, index: Box<Expr>, optional: bool },
    Slice { target: Box<Expr>, from: Option<Box<Expr>>, to: Option<Box<Expr>> },
    Unary(&'static str, Box<Expr>),
    Binary(String, Box<Expr>, Box<Expr>),
    Ternary(Box<Expr>, Box<Expr>, Box<Expr>),
    Call { name: String, args: Vec<Expr>, pos: usize },
    /// A predicate body (`{ … }` or a bare expression in predicate position).
    Closure(Box<Expr>),
    Let { name: String, value: Box<Expr>, body: Box<Expr> },
}

const PREDICATES: &[&str] = &[
    "map", "filter", "all", "any", "none", "one", "find", "findIndex", "count", "sortBy", "groupBy", "reduce",
];

pub fn parse(src: &str) -> Result<Expr, ParseError> {
    let toks = lex(src)?;
    let mut p = Parser { toks, i: 0, depth: 0 };
    let e = p.expr()?;
    match p.peek() {
        Tok::Eof => Ok(e),
        t => Err(p.error(format!("unexpected {} after the end of the expression", describe(t)))),
    }
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Int(i) => format!("number {i}"),
        Tok::Float(f) => format!("number {f}"),
        Tok::Str(s) => format!("string {s:?}"),
        Tok::Ident(n) => format!("name {n}"),
        Tok::Pointer(p) => p.clone(),
        Tok::Sym(s) => format!("\"{s}\""),
        Tok::Eof => "end of expression".into(),
    }
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    i: usize,
    /// How deep the parse has recursed (see [`MAX_DEPTH`]).
    depth: usize,
}

/// How deeply an expression may nest (each bracket is a few levels): deeper
/// input would exhaust the stack of whoever parses or evaluates it.
const MAX_DEPTH: usize = 400;

/// Binary operators: (spelling, precedence, right-associative).
fn binary_op(t: &Tok) -> Option<(&'static str, u8, bool)> {
    Some(match t {
        Tok::Sym("||") => ("||", 1, false),
        Tok::Ident(w) if w == "or" => ("||", 1, false),
        Tok::Sym("&&") => ("&&", 2, false),
        Tok::Ident(w) if w == "and" => ("&&", 2, false),
        Tok::Sym("==") => ("==", 3, false),
        Tok::Sym("!=") => ("!=", 3, false),
        Tok::Sym("<") => ("<", 3, false),
        Tok::Sym("<=") => ("<=", 3, false),
        Tok::Sym(">") => (">", 3, false),
        Tok::Sym(">=") => (">=", 3, false),
        Tok::Ident(w) if w == "in" => ("in", 3, false),
        Tok::Ident(w) if w == "matches" => ("matches", 3, false),
        Tok::Ident(w) if w == "contains" => ("contains", 3, false),
        Tok::Ident(w) if w == "startsWith" => ("startsWith", 3, false),
        Tok::Ident(w) if w == "endsWith" => ("endsWith", 3, false),
        Tok::Sym("..") => ("..", 4, false),
        Tok::Sym("+") => ("+", 5, false),
        Tok::Sym("-") => ("-", 5, false),
        Tok::Sym("*") => ("*", 6, false),
        Tok::Sym("/") => ("/", 6, false),
        Tok::Sym("%") => ("%", 6, false),
        Tok::Sym("**") | Tok::Sym("^") => ("**", 7, true),
        Tok::Sym("??") => ("??", 8, false),
        _ => return None,
    })
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.i.min(self.toks.len() - 1)].0
    }
    fn peek_at(&self, k: usize) -> &Tok {
        &self.toks[(self.i + k).min(self.toks.len() - 1)].0
    }
    fn pos(&self) -> usize {
        self.toks[self.i.min(self.toks.len() - 1)].1
    }
    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if self.i < self.toks.len() - 1 {
            self.i += 1;
        }
        t
    }
    fn error(&self, message: String) -> ParseError {
        ParseError { message, pos: self.pos() }
    }
    fn eat(&mut self, sym: &str) -> bool {
        if matches!(self.peek(), Tok::Sym(s) if *s == sym) {
            self.next();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, sym: &str) -> Result<(), ParseError> {
        if self.eat(sym) {
            Ok(())
        } else {
            Err(self.error(format!("expected \"{sym}\", found {}", describe(self.peek()))))
        }
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        self.nested(Self::expr_here)
    }

    fn expr_here(&mut self) -> Result<Expr, ParseError> {
        if matches!(self.peek(), Tok::Ident(w) if w == "let") {
            self.next();
            let name = match self.next() {
                Tok::Ident(n) => n,
                t => return Err(self.error(format!("let needs a name, found {}", describe(&t)))),
            };
            self.expect("=")?;
            let value = self.pipe()?;
            self.expect(";")?;
            let body = self.expr()?;
            return Ok(Expr::Let { name, value: Box::new(value), body: Box::new(body) });
        }
        self.pipe()
    }

    fn pipe(&mut self) -> Result<Expr, ParseError> {
        let mut lhs = self.ternary()?;
        while matches!(self.peek(), Tok::Sym("|")) {
            self.next();
            let pos = self.pos();
            let name = match self.next() {
                Tok::Ident(n) => n,
                t => return Err(self.error(format!("a pipe needs a function call after |, found {}", describe(&t)))),
            };
            let mut args = vec![lhs];
            if self.eat("(") {
                args.extend(self.args(&name)?);
            }
            lhs = Expr::Call { name, args, pos };
        }
        Ok(lhs)
    }

    fn ternary(&mut self) -> Result<Expr, ParseError> {
        self.nested(Self::ternary_here)
    }

    fn ternary_here(&mut self) -> Result<Expr, ParseError> {
        let c = self.binary(0)?;
        if self.eat("?") {
            let a = self.ternary()?;
            self.expect(":")?;
            let b = self.ternary()?;
            return Ok(Expr::Ternary(Box::new(c), Box::new(a), Box::new(b)));
        }
        Ok(c)
    }

    fn binary(&mut self, min: u8) -> Result<Expr, ParseError> {
        self.nested(|p| p.binary_here(min))
    }

    /// Runs one level of the descent, refusing to go deeper than [`MAX_DEPTH`].
    fn nested(&mut self, f: impl FnOnce(&mut Self) -> Result<Expr, ParseError>) -> Result<Expr, ParseError> {
        if self.depth >= MAX_DEPTH {
            return Err(self.error(format!("the expression nests too deeply (more than {MAX_DEPTH} levels); split it with let")));
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        r
    }

    fn binary_here(&mut self, min: u8) -> Result<Expr, ParseError> {
        let mut lhs = self.unary()?;
        loop {
            // `not in`, `not matches`, …
            let negated = matches!(self.peek(), Tok::Ident(w) if w == "not")
                && matches!(self.peek_at(1), Tok::Ident(w) if matches!(w.as_str(), "in" | "matches" | "contains" | "startsWith" | "endsWith"));
            let tok = if negated { self.peek_at(1).clone() } else { self.peek().clone() };
            let Some((op, prec, right)) = binary_op(&tok) else { break };
            if prec < min {
                break;
            }
            if negated {
                self.next();
            }
            self.next();
            let rhs = self.binary(if right { prec } else { prec + 1 })?;
            let e = Expr::Binary(op.to_string(), Box::new(lhs), Box::new(rhs));
            lhs = if negated { Expr::Unary("!", Box::new(e)) } else { e };
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        self.nested(Self::unary_here)
    }

    fn unary_here(&mut self) -> Result<Expr, ParseError> {
        match self.peek() {
            Tok::Sym("-") => {
                self.next();
                Ok(Expr::Unary("-", Box::new(self.unary()?)))
            }
            Tok::Sym("+") => {
                self.next();
                self.unary()
            }
            Tok::Sym("!") => {
                self.next();
                Ok(Expr::Unary("!", Box::new(self.unary()?)))
            }
            Tok::Ident(w) if w == "not" => {
                self.next();
                Ok(Expr::Unary("!", Box::new(self.unary()?)))
            }
            _ => self.postfix(),
        }
    }

    fn postfix(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.primary()?;
        loop {
            match self.peek() {
                Tok::Sym(s @ ("." | "?.")) => {
                    let optional = *s == "?.";
                    self.next();
                    if optional && matches!(self.peek(), Tok::Sym("[")) {
                        self.next();
                        let index = self.expr()?;
                        self.expect("]")?;
                        e = Expr::Index { target: Box::new(e), index: Box::new(index), optional };
                        continue;
                    }
                    match self.next() {
                        Tok::Ident(name) => e = Expr::Member { target: Box::new(e), name, optional },
                        t => return Err(self.error(format!("expected a field name after \".\", found {}", describe(&t)))),
                    }
                }
                Tok::Sym("[") => {
                    self.next();
                    if self.eat(":") {
                        let to = if matches!(self.peek(), Tok::Sym("]")) { None } else { Some(Box::new(self.expr()?)) };
                        self.expect("]")?;
                        e = Expr::Slice { target: Box::new(e), from: None, to };
                        continue;
                    }
                    let index = self.expr()?;
                    if self.eat(":") {
                        let to = if matches!(self.peek(), Tok::Sym("]")) { None } else { Some(Box::new(self.expr()?)) };
                        self.expect("]")?;
                        e = Expr::Slice { target: Box::new(e), from: Some(Box::new(index)), to };
                        continue;
                    }
                    self.expect("]")?;
                    e = Expr::Index { target: Box::new(e), index: Box::new(index), optional: false };
                }
                _ => return Ok(e),
            }
        }
    }

    fn args(&mut self, func: &str) -> Result<Vec<Expr>, ParseError> {
        let mut args = Vec::new();
        let predicate = PREDICATES.contains(&func);
        loop {
            if self.eat(")") {
                return Ok(args);
            }
            // In a predicate function a `{` opens the predicate body, not a map.
            let arg = if predicate && matches!(self.peek(), Tok::Sym("{")) {
                self.next();
                let body = self.expr()?;
                self.expect("}")?;
                Expr::Closure(Box::new(body))
            } else {
                self.expr()?
            };
            args.push(arg);
            if !self.eat(",") {
                self.expect(")")?;
                return Ok(args);
            }
        }
    }

    fn primary(&mut self) -> Result<Expr, ParseError> {
        let pos = self.pos();
        match self.next() {
            Tok::Int(i) => Ok(Expr::Int(i)),
            Tok::Float(f) => Ok(Expr::Float(f)),
            Tok::Str(s) => Ok(Expr::Str(s)),
            Tok::Pointer(p) => Ok(Expr::Pointer(p)),
            Tok::Ident(w) => match w.as_str() {
                "true" => Ok(Expr::Bool(true)),
                "false" => Ok(Expr::Bool(false)),
                "nil" => Ok(Expr::Nil),
                _ if matches!(self.peek(), Tok::Sym("(")) => {
                    self.next();
                    let args = self.args(&w)?;
                    Ok(Expr::Call { name: w, args, pos })
                }
                _ => Ok(Expr::Ident(w, pos)),
            },
            Tok::Sym("(") => {
                let e = self.expr()?;
                self.expect(")")?;
                Ok(e)
            }
            Tok::Sym("[") => {
                let mut items = Vec::new();
                loop {
                    if self.eat("]") {
                        return Ok(Expr::Array(items));
                    }
                    items.push(self.expr()?);
                    if !self.eat(",") {
                        self.expect("]")?;
                        return Ok(Expr::Array(items));
                    }
                }
            }
            Tok::Sym("{") => {
                let mut entries = Vec::new();
                loop {
                    if self.eat("}") {
                        return Ok(Expr::Map(entries));
                    }
                    let key = match self.next() {
                        Tok::Ident(k) | Tok::Str(k) => k,
                        Tok::Int(i) => i.to_string(),
                        t => return Err(self.error(format!("expected a map key, found {}", describe(&t)))),
                    };
                    self.expect(":")?;
                    entries.push((key, self.expr()?));
                    if !self.eat(",") {
                        self.expect("}")?;
                        return Ok(Expr::Map(entries));
                    }
                }
            }
            Tok::Sym(".") => match self.next() {
                Tok::Ident(name) => Ok(Expr::Member { target: Box::new(Expr::Pointer("#".into())), name, optional: false }),
                t => Err(self.error(format!("expected a field name after \".\", found {}", describe(&t)))),
            },
            t => Err(ParseError { message: format!("unexpected {}", describe(&t)), pos }),
        }
    }
}
