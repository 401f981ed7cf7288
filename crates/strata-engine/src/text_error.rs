//! The engine's text-layer error: tokenizer, chat template and sampling parameters share it.

/// Errors of the engine's text layer: tokenizer, chat template, sampling parameters.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("{file}: {msg}")]
    Load { file: String, msg: String },
    #[error("{file}: field `{field}`: {msg}")]
    InvalidConfig { file: &'static str, field: String, msg: String },
    #[error("tokenization failed: {0}")]
    Encode(String),
    #[error("detokenization failed: {0}")]
    Decode(String),
    #[error("chat template does not compile: {0}")]
    TemplateSyntax(String),
    #[error("chat template failed: {0}")]
    TemplateRender(String),
    /// The template itself rejected the conversation via `raise_exception(msg)`.
    #[error("{0}")]
    TemplateRaised(String),
    /// The template renders a plain chat but failed on this conversation.
    #[error("the model's chat template cannot render this conversation: {0}")]
    TemplateConversation(String),
    #[error("this model has no chat template")]
    NoChatTemplate,
    /// The vocabulary lacks the fill-in-the-middle tokens named.
    #[error("this model cannot fill in the middle: its vocabulary has no FIM {0} token")]
    NoInfill(String),
    #[error("`{field}` {msg}")]
    InvalidSampling { field: &'static str, msg: String },
}

impl TextError {
    /// Stable machine-readable kind, for API error bodies and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            TextError::Load { .. } => "tokenizer_load",
            TextError::InvalidConfig { .. } => "invalid_config",
            TextError::Encode(_) => "encode",
            TextError::Decode(_) => "decode",
            TextError::TemplateSyntax(_) => "template_syntax",
            TextError::TemplateRender(_) => "template_render",
            TextError::TemplateRaised(_) => "template_exception",
            TextError::TemplateConversation(_) => "template_conversation",
            TextError::NoChatTemplate => "no_chat_template",
            TextError::NoInfill(_) => "no_infill",
            TextError::InvalidSampling { .. } => "invalid_sampling",
        }
    }

    /// Whether the request (not the model files or the server) is at fault.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            TextError::TemplateRaised(_)
                | TextError::TemplateConversation(_)
                | TextError::NoChatTemplate
                | TextError::NoInfill(_)
                | TextError::InvalidSampling { .. }
        )
    }
}
