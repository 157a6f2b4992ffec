package contract

import (
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth is the deepest nesting of objects and arrays the decoder accepts.
// The contract needs 3 (readings[i].sensors); the rest is headroom so a wrong
// payload gets a type error rather than a depth error.
const maxDepth = 16

// checkSyntax reports whether s is one valid JSON value (RFC 8259) with
// optional surrounding whitespace, with strings in valid UTF-8, no unpaired
// UTF-16 surrogate escapes, and at most maxDepth levels of nesting. It does
// not allocate unless it fails.
//
// It also counts the elements of the arrays that are members of the root
// object (the first few of them), so the decoder can size slices up front.
func checkSyntax(s string) (arrayCounts, *Error) {
	sc := syntaxScanner{s: s}
	i := skipWS(s, 0)
	if i == len(s) {
		if len(s) == 0 {
			return sc.counts, syntaxErr(0, "empty payload")
		}
		return sc.counts, syntaxErr(i, "no JSON value, only whitespace")
	}
	i = sc.value(i, 0)
	if sc.err != nil {
		return sc.counts, sc.err
	}
	if j := skipWS(s, i); j != len(s) {
		return sc.counts, syntaxErr(j, "unexpected data after the JSON value")
	}
	return sc.counts, nil
}

// arrayCounts holds the element counts of up to 4 arrays, by offset.
type arrayCounts struct {
	n   int
	off [4]int
	len [4]int
}

// get returns the element count of the array starting at offset off, or -1
// when it was not counted.
func (c *arrayCounts) get(off int) int {
	for k := 0; k < c.n; k++ {
		if c.off[k] == off {
			return c.len[k]
		}
	}
	return -1
}

func syntaxErr(off int, msg string) *Error {
	return &Error{Reason: ReasonValidation, Rule: fmt.Sprintf("invalid JSON at byte offset %d: %s", off, msg)}
}

type syntaxScanner struct {
	s      string
	err    *Error
	counts arrayCounts
}

func (sc *syntaxScanner) fail(off int, msg string) int {
	if sc.err == nil {
		sc.err = syntaxErr(off, msg)
	}
	return len(sc.s)
}

func (sc *syntaxScanner) eof(off int) int {
	return sc.fail(off, "unexpected end of input (is the payload truncated?)")
}

// value checks the value starting at s[i] (not whitespace) and returns the
// offset just after it. It stays one function of about 90 lines: one case
// per kind of JSON value, in the order of the grammar, on the path every
// payload takes byte by byte.
func (sc *syntaxScanner) value(i, depth int) int {
	s := sc.s
	if i >= len(s) {
		return sc.eof(i)
	}
	switch c := s[i]; c {
	case '{':
		if depth >= maxDepth {
			return sc.fail(i, fmt.Sprintf("nesting deeper than %d levels", maxDepth))
		}
		i = skipWS(s, i+1)
		if i < len(s) && s[i] == '}' {
			return i + 1
		}
		for {
			if i >= len(s) {
				return sc.eof(i)
			}
			if s[i] != '"' {
				return sc.fail(i, "expected a string for an object key, found "+describeByte(s, i))
			}
			i = sc.str(i)
			if sc.err != nil {
				return i
			}
			i = skipWS(s, i)
			if i >= len(s) {
				return sc.eof(i)
			}
			if s[i] != ':' {
				return sc.fail(i, "expected ':' after an object key, found "+describeByte(s, i))
			}
			i = skipWS(s, i+1)
			i = sc.value(i, depth+1)
			if sc.err != nil {
				return i
			}
			i = skipWS(s, i)
			if i >= len(s) {
				return sc.eof(i)
			}
			switch s[i] {
			case ',':
				i = skipWS(s, i+1)
				if i < len(s) && s[i] == '}' {
					return sc.fail(i, "trailing comma before '}'")
				}
			case '}':
				return i + 1
			default:
				return sc.fail(i, "expected ',' or '}' after an object member, found "+describeByte(s, i))
			}
		}
	case '[':
		if depth >= maxDepth {
			return sc.fail(i, fmt.Sprintf("nesting deeper than %d levels", maxDepth))
		}
		end, n := sc.array(i, depth)
		if depth == 1 && sc.counts.n < len(sc.counts.off) {
			sc.counts.off[sc.counts.n], sc.counts.len[sc.counts.n] = i, n
			sc.counts.n++
		}
		return end
	case '"':
		return sc.str(i)
	case 't':
		return sc.literal(i, "true")
	case 'f':
		return sc.literal(i, "false")
	case 'n':
		return sc.literal(i, "null")
	case 'N':
		if strings.HasPrefix(s[i:], "NaN") {
			return sc.fail(i, "NaN is not valid JSON; numbers must be finite (leave the value out instead)")
		}
	case 'I':
		if strings.HasPrefix(s[i:], "Infinity") {
			return sc.fail(i, "Infinity is not valid JSON; numbers must be finite")
		}
	default:
		if c == '-' || c >= '0' && c <= '9' {
			return sc.number(i)
		}
	}
	if i+1 < len(s) && (s[i] == '+' || s[i] == '.') {
		return sc.fail(i, "invalid number: a JSON number starts with '-' or a digit")
	}
	return sc.fail(i, "expected a JSON value, found "+describeByte(s, i))
}

// array checks the array starting at s[i] and returns the offset after it
// and its number of elements.
func (sc *syntaxScanner) array(i, depth int) (end, n int) {
	s := sc.s
	i = skipWS(s, i+1)
	if i < len(s) && s[i] == ']' {
		return i + 1, 0
	}
	for {
		n++
		i = sc.value(i, depth+1)
		if sc.err != nil {
			return i, n
		}
		i = skipWS(s, i)
		if i >= len(s) {
			return sc.eof(i), n
		}
		switch s[i] {
		case ',':
			i = skipWS(s, i+1)
			if i < len(s) && s[i] == ']' {
				return sc.fail(i, "trailing comma before ']'"), n
			}
		case ']':
			return i + 1, n
		default:
			return sc.fail(i, "expected ',' or ']' after an array element, found "+describeByte(s, i)), n
		}
	}
}

func (sc *syntaxScanner) literal(i int, lit string) int {
	if strings.HasPrefix(sc.s[i:], lit) {
		return i + len(lit)
	}
	if len(sc.s)-i < len(lit) && strings.HasPrefix(lit, sc.s[i:]) {
		return sc.eof(len(sc.s))
	}
	return sc.fail(i, "expected a JSON value, found "+describeByte(sc.s, i))
}

// number checks a number per the JSON grammar
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (sc *syntaxScanner) number(i int) int {
	s := sc.s
	start := i
	if s[i] == '-' {
		i++
		if i < len(s) && s[i] == 'I' && strings.HasPrefix(s[i:], "Infinity") {
			return sc.fail(i-1, "-Infinity is not valid JSON; numbers must be finite")
		}
	}
	switch {
	case i >= len(s):
		return sc.eof(i)
	case s[i] == '0':
		i++
		if i < len(s) && isDigit(s[i]) {
			return sc.fail(start, "invalid number: leading zeros are not allowed")
		}
	case isDigit(s[i]):
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	default:
		return sc.fail(i, "invalid number: expected a digit, found "+describeByte(s, i))
	}
	if i < len(s) && s[i] == '.' {
		i = sc.digits(i+1, "after '.'")
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		i = sc.digits(i, "in the exponent")
	}
	return i
}

// digits checks the digits of a number's fraction or exponent, which must
// start at s[i], and returns the offset after them (len(s) when they are
// missing); where says where they are in the number's message.
func (sc *syntaxScanner) digits(i int, where string) int {
	s := sc.s
	if i >= len(s) {
		return sc.eof(i)
	}
	if !isDigit(s[i]) {
		return sc.fail(i, "invalid number: expected a digit "+where+", found "+describeByte(s, i))
	}
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return i
}

// str checks the string starting at the quote s[i] and returns the offset
// after its closing quote.
func (sc *syntaxScanner) str(i int) int {
	s := sc.s
	i++
	for {
		// Fast path over plain ASCII.
		for i < len(s) {
			c := s[i]
			if c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
				break
			}
			i++
		}
		if i >= len(s) {
			return sc.eof(i)
		}
		switch c := s[i]; {
		case c == '"':
			return i + 1
		case c == '\\':
			i = sc.escape(i)
			if sc.err != nil {
				return i
			}
		case c < 0x20:
			return sc.fail(i, fmt.Sprintf("control character U+%04X in a string must be escaped", c))
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size <= 1 {
				return sc.fail(i, fmt.Sprintf("invalid UTF-8 in a string (byte 0x%02X)", c))
			}
			i += size
		}
	}
}

// escape checks the escape sequence starting at the backslash s[i].
func (sc *syntaxScanner) escape(i int) int {
	s := sc.s
	if i+1 >= len(s) {
		return sc.eof(i + 1)
	}
	switch s[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return i + 2
	case 'u':
		r, ok := hex4(s, i+2)
		if !ok {
			if len(s) < i+6 {
				return sc.eof(len(s))
			}
			return sc.fail(i, `invalid \u escape: expected 4 hexadecimal digits`)
		}
		switch {
		case utf16.IsSurrogate(r) && r < 0xDC00: // high surrogate: a low one must follow
			if i+7 < len(s) && s[i+6] == '\\' && s[i+7] == 'u' {
				if r2, ok := hex4(s, i+8); ok && r2 >= 0xDC00 && r2 <= 0xDFFF {
					return i + 12
				}
			}
			return sc.fail(i, `invalid \u escape: unpaired UTF-16 surrogate`)
		case utf16.IsSurrogate(r):
			return sc.fail(i, `invalid \u escape: unpaired UTF-16 surrogate`)
		}
		return i + 6
	default:
		return sc.fail(i, "invalid escape sequence \\"+describeRaw(s, i+1))
	}
}

// hex4 decodes the 4 hexadecimal digits at s[i:i+4].
func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for _, c := range []byte(s[i : i+4]) {
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	return r, true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func skipWS(s string, i int) int {
	for i < len(s) {
		switch s[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// describeByte names the character at s[i] for an error message.
func describeByte(s string, i int) string {
	if i >= len(s) {
		return "end of input"
	}
	return describeRaw(s, i)
}

func describeRaw(s string, i int) string {
	if i >= len(s) {
		return "end of input"
	}
	c := s[i]
	switch {
	case c >= 0x20 && c < 0x7F:
		return fmt.Sprintf("%q", string(c))
	case i == 0 && strings.HasPrefix(s, "\xEF\xBB\xBF"):
		return "a UTF-8 byte order mark (remove it)"
	default:
		return fmt.Sprintf("byte 0x%02X", c)
	}
}

// Helpers for the schema walk. They run on input that checkSyntax accepted,
// so they do not re-check the grammar.

// skipString returns the offset after the string starting at the quote
// s[i], and whether it contains escapes.
func skipString(s string, i int) (end int, escaped bool) {
	for i++; i < len(s); i++ {
		switch s[i] {
		case '"':
			return i + 1, escaped
		case '\\':
			escaped = true
			i++
		}
	}
	return len(s), escaped
}

// skipValue returns the offset after the value starting at s[i].
func skipValue(s string, i int) int {
	switch s[i] {
	case '"':
		end, _ := skipString(s, i)
		return end
	case '{', '[':
		depth := 0
		for i < len(s) {
			switch s[i] {
			case '"':
				i, _ = skipString(s, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	case 't', 'n':
		return i + 4
	case 'f':
		return i + 5
	default:
		for i < len(s) {
			c := s[i]
			if !(isDigit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E') {
				break
			}
			i++
		}
		return i
	}
}

// unquote decodes the JSON string s (without its quotes) that contains
// escapes. The syntax check guarantees the escapes are well formed.
func unquote(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			j := strings.IndexByte(s[i:], '\\')
			if j < 0 {
				j = len(s) - i
			}
			b.WriteString(s[i : i+j])
			i += j
			continue
		}
		switch s[i+1] {
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, _ := hex4(s, i+2)
			if utf16.IsSurrogate(r) {
				r2, _ := hex4(s, i+8)
				r = utf16.DecodeRune(r, r2)
				i += 6
			}
			b.WriteRune(r)
			i += 6
			continue
		default: // '"', '\\', '/'
			b.WriteByte(s[i+1])
		}
		i += 2
	}
	return b.String()
}

// kindName names the JSON type of the value starting at s[i], for errors.
func kindName(s string, i int) string {
	switch s[i] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}
