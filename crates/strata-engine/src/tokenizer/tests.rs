use super::*;

/// GPT-2 style byte-to-char map (the byte-level BPE alphabet).
pub(crate) fn byte_level_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut map = vec!['\0'; 256];
    for (b, c) in bs.iter().zip(cs) {
        map[*b as usize] = char::from_u32(c).unwrap();
    }
    map
}

/// Ids of the special tokens in [`byte_level_tokenizer_json`].
pub(crate) const BOS: u32 = 263;
pub(crate) const EOS: u32 = 264;
pub(crate) const EOT: u32 = 265;

/// A real byte-level BPE tokenizer: the 256 byte symbols (ids 0..256), seven merges
/// (256..263) and the special tokens <s>, </s>, <|eot|> (263..266).
pub(crate) fn byte_level_tokenizer_json() -> String {
    let chars = byte_level_chars();
    let mut vocab = serde_json::Map::new();
    for (i, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), serde_json::json!(i));
    }
    // Ġ is the byte-level char for a space.
    let sp = chars[b' ' as usize];
    let merges = [
        (format!("{sp}"), "w".to_string()),
        (format!("{sp}w"), "o".to_string()),
        ("h".to_string(), "e".to_string()),
        ("l".to_string(), "l".to_string()),
        ("he".to_string(), "ll".to_string()),
        // The first two bytes of "é" (C3 A9) and of "😀" (F0 9F 98 80).
        (chars[0xC3].to_string(), chars[0xA9].to_string()),
        (chars[0xF0].to_string(), chars[0x9F].to_string()),
    ];
    let mut next = 256;
    let mut merge_list = Vec::new();
    for (a, b) in &merges {
        vocab.insert(format!("{a}{b}"), serde_json::json!(next));
        next += 1;
        merge_list.push(serde_json::json!(format!("{a} {b}")));
    }
    assert_eq!(next, BOS);
    let added = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true})
    };
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [added(BOS, "<s>"), added(EOS, "</s>"), added(EOT, "<|eot|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merge_list}
    });
    json.to_string()
}

/// A SentencePiece-style BPE tokenizer.json (Llama 2 / Mistral v0.1 layout): <unk>,
/// <s>, </s>, 256 byte-fallback tokens, a few "▁" pieces; Prepend+Replace normalizer,
/// `<s> $A` post-processor and the Replace/ByteFallback/Fuse/Strip decoder.
pub(crate) fn sentencepiece_tokenizer_json() -> String {
    use serde_json::json;
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(t.to_string(), json!(i));
    }
    for b in 0..256u32 {
        vocab.insert(format!("<0x{b:02X}>"), json!(3 + b));
    }
    let pieces = [
        "▁", "H", "i", "t", "h", "e", "r", "▁H", "▁Hi", "▁t", "▁th", "▁the", "▁ther", "▁there", "[", "I", "N", "S",
        "T", "]", "/",
    ];
    for (i, p) in pieces.iter().enumerate() {
        vocab.insert(p.to_string(), json!(259 + i));
    }
    let merges = ["▁ H", "▁H i", "▁ t", "▁t h", "▁th e", "▁the r", "▁ther e"];
    let added = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": null,
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": merges}
    })
    .to_string()
}

fn tok(config: Option<&str>, gen_cfg: Option<&str>) -> TextTokenizer {
    TextTokenizer::from_sources(&byte_level_tokenizer_json(), config, gen_cfg, None).unwrap()
}

#[test]
fn encodes_and_decodes_round_trip() {
    let t = tok(None, None);
    let text = "hello world é😀 ok";
    let ids = t.encode(text, false).unwrap();
    assert!(ids.len() < text.len(), "merges applied: {ids:?}");
    assert_eq!(t.decode(&ids, false).unwrap(), text);
    // "hell" is one merged token.
    let hell = t.token_to_id("hell").unwrap();
    assert_eq!(t.encode("hell", false).unwrap(), vec![hell]);
    assert_eq!(t.vocab_size(), 256 + 3 + 7);
}

#[test]
fn special_tokens_from_config_strings_and_objects() {
    let config = r#"{"bos_token": {"content": "<s>", "special": true}, "eos_token": "</s>",
        "add_bos_token": true, "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}"#;
    let gen_cfg = r#"{"bos_token_id": 263, "eos_token_id": [265, 264]}"#;
    let t = tok(Some(config), Some(gen_cfg));
    assert_eq!(t.bos_id(), Some(BOS));
    assert_eq!(t.eos_ids(), &[EOS, EOT]);
    assert!(t.is_eos(EOT) && t.is_eos(EOS) && !t.is_eos(BOS));
    assert!(t.add_bos_token());
    let ids = t.encode("he", true).unwrap();
    assert_eq!(ids[0], BOS);
    assert_eq!(t.encode("he", false).unwrap(), vec![t.token_to_id("he").unwrap()]);
    let rendered = t.apply_chat_template(&[ChatMessage::new("user", "hi")], false).unwrap();
    assert_eq!(rendered, "<s>hi</s>");
    let chat_ids = t.encode_chat(&[ChatMessage::new("user", "hi")], false).unwrap();
    assert_eq!(chat_ids.first(), Some(&BOS), "exactly one BOS, from the template");
    assert_ne!(chat_ids.get(1), Some(&BOS));
    assert_eq!(chat_ids.last(), Some(&EOS));
    assert_eq!(t.decode(&chat_ids, true).unwrap(), "hi");
}

#[test]
fn add_eos_token_appends_eos() {
    let config = r#"{"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": false, "add_eos_token": true}"#;
    let t = tok(Some(config), None);
    let ids = t.encode("he", true).unwrap();
    assert_eq!(ids.last(), Some(&EOS));
    assert_ne!(ids.first(), Some(&BOS));
    assert!(!t.add_bos_token());
}

#[test]
fn missing_special_token_is_added() {
    let config = r#"{"eos_token": "<|im_end|>"}"#;
    let t = tok(Some(config), None);
    let id = t.token_to_id("<|im_end|>").unwrap();
    assert_eq!(t.eos_ids(), &[id]);
    assert_eq!(t.encode("a<|im_end|>", false).unwrap().last(), Some(&id));
    assert_eq!(t.vocab_size(), 256 + 3 + 7 + 1);
}

#[test]
fn generation_config_eos_int_and_no_config() {
    let t = tok(None, Some(r#"{"eos_token_id": 265}"#));
    assert_eq!(t.eos_ids(), &[EOT]);
    assert_eq!(t.bos_id(), None);
    assert!(t.chat_template().is_none());
    let err = t.apply_chat_template(&[ChatMessage::new("user", "x")], true).unwrap_err();
    assert!(matches!(err, TextError::NoChatTemplate));
    let err = TextTokenizer::from_sources(&byte_level_tokenizer_json(), None, Some(r#"{"eos_token_id": "x"}"#), None)
        .unwrap_err();
    assert!(err.to_string().contains("eos_token_id"), "{err}");
}

#[test]
fn chat_template_list_form_and_file_override() {
    let config = r#"{"chat_template": [
        {"name": "default", "template": "D{{ messages|length }}"},
        {"name": "tool_use", "template": "T"}]}"#;
    let t = tok(Some(config), None);
    assert_eq!(t.apply_chat_template(&[], false).unwrap(), "D0");
    assert_eq!(t.named_chat_template("tool_use").unwrap().render(&[], false).unwrap(), "T");
    let t = TextTokenizer::from_sources(
        &byte_level_tokenizer_json(),
        Some(config),
        None,
        Some("F{{ add_generation_prompt }}"),
    )
    .unwrap();
    assert_eq!(t.apply_chat_template(&[], true).unwrap(), "FTrue");
    let bad = TextTokenizer::from_sources(&byte_level_tokenizer_json(), Some(r#"{"chat_template": 5}"#), None, None);
    assert!(matches!(bad, Err(TextError::InvalidConfig { .. })));
}

#[test]
fn broken_inputs_are_errors_not_panics() {
    assert!(matches!(TextTokenizer::from_sources("{", None, None, None), Err(TextError::Load { .. })));
    assert!(matches!(
        TextTokenizer::from_sources(&byte_level_tokenizer_json(), Some("[oops"), None, None),
        Err(TextError::Load { .. })
    ));
    let t = tok(None, None);
    assert!(t.decode(&[999_999], false).unwrap().is_empty());
    assert!(matches!(
        TextTokenizer::from_sources(&byte_level_tokenizer_json(), Some(r#"{"chat_template": "{% if %}"}"#), None, None),
        Err(TextError::TemplateSyntax(_))
    ));
}

/// Expected ids from transformers 5.23.0 `AutoTokenizer.from_pretrained` on a directory
/// holding [`sentencepiece_tokenizer_json`], a tokenizer_config.json with
/// `{"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
/// "unk_token": "<unk>", "add_bos_token": true, "add_eos_token": false, ...extra}` and a
/// config.json with the given `model_type`. transformers rebuilds `LlamaTokenizer` models
/// (Metaspace, prepend "first" unless legacy) but loads `mistral` ones from tokenizer.json.
#[test]
fn llama_class_rebuild_matches_transformers() {
    let texts = ["Hi there", "<s>Hi there</s> there", " Hi", "there</s>Hi", "你 Hi"];
    let cases: [(&str, &str, [&[u32]; 5]); 4] = [
        (
            "llama",
            r#""legacy": false"#,
            [&[267, 272], &[1, 260, 261, 272, 2, 272], &[267], &[272, 2, 260, 261], &[259, 231, 192, 163, 267]],
        ),
        (
            "llama",
            r#""legacy": true"#,
            [&[267, 272], &[1, 267, 272, 2, 272], &[267], &[272, 2, 267], &[259, 231, 192, 163, 267]],
        ),
        (
            "llama",
            r#""add_prefix_space": false"#,
            [
                &[260, 261, 272],
                &[1, 260, 261, 272, 2, 272],
                &[267],
                &[262, 263, 264, 265, 264, 2, 260, 261],
                &[231, 192, 163, 267],
            ],
        ),
        (
            "mistral",
            r#""legacy": false"#,
            [&[267, 272], &[1, 267, 272, 2, 259, 272], &[259, 267], &[272, 2, 267], &[259, 231, 192, 163, 267]],
        ),
    ];
    let json = sentencepiece_tokenizer_json();
    for (model_type, extra, expected) in cases {
        let config = format!(
            r#"{{"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "add_bos_token": true, "add_eos_token": false, {extra}}}"#
        );
        let model_config = format!(r#"{{"model_type": "{model_type}"}}"#);
        let t = TextTokenizer::from_parts(TokenizerSources {
            tokenizer_json: &json,
            tokenizer_config_json: Some(&config),
            model_config_json: Some(&model_config),
            ..Default::default()
        })
        .unwrap();
        for (text, want) in texts.iter().zip(expected) {
            let ids = t.encode(text, false).unwrap();
            assert_eq!(ids, want, "{model_type} {extra} {text:?}");
            let with = t.encode(text, true).unwrap();
            assert_eq!(with[0], 1, "add_bos_token");
            assert_eq!(&with[1..], want);
        }
        // The SentencePiece decoder drops the first leading space only.
        let ids = t.encode("Hi there", false).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), "Hi there");
    }
}

#[test]
fn clean_up_tokenization_matches_transformers() {
    assert_eq!(
        clean_up_tokenization("Hello , world ! I do n't know . It 's ok ?"),
        "Hello, world! I don't know. It's ok?"
    );
    assert_eq!(clean_up_tokenization("a ' b"), "a'b");
    // Chained replaces: " ' " first creates " 's"-free text.
    assert_eq!(clean_up_tokenization("x  ' s"), "x 's".replace(" 's", "'s"));
    // BPE models never clean up, even when the config asks.
    let t = tok(Some(r#"{"clean_up_tokenization_spaces": true}"#), None);
    assert!(!t.cleans_up_tokenization_spaces());
    let ids = t.encode("a , b", false).unwrap();
    assert_eq!(t.decode(&ids, false).unwrap(), "a , b");
}

#[test]
fn text_types_can_be_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<TextTokenizer>();
    shared::<ChatTemplate>();
    shared::<crate::detok::DetokState>();
    shared::<crate::detok::IncrementalDecoder<'static, TextTokenizer>>();
    shared::<crate::stop::StopMatcher>();
    fn sendable<T: Send>() {}
    sendable::<crate::sampler::Sampler>();
}

#[test]
fn error_types_are_stable() {
    assert_eq!(TextError::NoChatTemplate.error_type(), "no_chat_template");
    assert!(TextError::TemplateRaised("x".into()).is_client_error());
    assert!(!TextError::Encode("x".into()).is_client_error());
}

/// A Hugging Face tokenizer's FIM tokens are its special added tokens of llama.cpp's
/// texts; the prompt is `[BOS] PRE prefix SUF suffix MID`; without them, a clear error.
#[test]
fn fill_in_the_middle_from_added_tokens() {
    let mut json: serde_json::Value = serde_json::from_str(&byte_level_tokenizer_json()).unwrap();
    let added = json["added_tokens"].as_array_mut().unwrap();
    for (id, content, special) in
        [(266, "<fim_prefix>", true), (267, "<fim_suffix>", true), (268, "<fim_middle>", true), (269, "<PAD>", false)]
    {
        added.push(serde_json::json!({"id": id, "content": content, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": special}));
    }
    let json = json.to_string();
    assert!(fills_in_middle(&json, None));
    let t =
        TextTokenizer::from_sources(&json, Some(r#"{"bos_token": "<s>", "add_bos_token": true}"#), None, None).unwrap();
    assert_eq!(t.fim(), FimIds { pre: Some(266), suf: Some(267), mid: Some(268), ..FimIds::default() });
    let infill = Infill { prefix: "hello".into(), suffix: " wow".into() };
    let ids = t.encode_infill(&infill).unwrap();
    let mut want = vec![BOS, 266];
    want.extend(t.encode("hello", false).unwrap());
    want.push(267);
    want.extend(t.encode(" wow", false).unwrap());
    want.push(268);
    assert_eq!(ids, want);

    let plain = tok(None, None);
    assert!(!fills_in_middle(&byte_level_tokenizer_json(), None));
    let err = plain.encode_infill(&infill).unwrap_err();
    assert!(matches!(err, TextError::NoInfill(_)) && err.is_client_error(), "{err}");
    assert!(err.to_string().contains("no FIM prefix, suffix, middle token"), "{err}");
}

#[test]
fn a_harmony_template_ends_generation_at_call_and_return() {
    // The markers are made tokens of the vocabulary by naming them (as no real config
    // does); only a harmony template makes them ends, beside the config's eos.
    let config = |template: &str| {
        serde_json::json!({"eos_token": "<|endoftext|>", "pad_token": "<|call|>", "unk_token": "<|return|>",
            "chat_template": template})
        .to_string()
    };
    let harmony = "<|start|>{{ messages[0].role }}<|channel|>final<|message|>{{ messages[0].content }}<|end|>";
    let t = tok(Some(&config(harmony)), None);
    let id = |s: &str| t.token_to_id(s).unwrap();
    assert_eq!(t.eos_ids(), &[id("<|endoftext|>"), id("<|call|>"), id("<|return|>")]);
    let t = tok(Some(&config("{{ messages[0].content }}<|call|><|return|>")), None);
    assert_eq!(t.eos_ids(), &[t.token_to_id("<|endoftext|>").unwrap()]);
}
