//! Generates text with a local Hugging Face model folder (GPT-2 or the Llama family) or a GGUF
//! file (the Llama family, f32/f16/bf16 or Q8_0, Q4_0-Q5_1 and Q2_K-Q6_K weights, dequantized on load),
//! streaming the tokens, and ends with the prefill and decode speed. Without `--model` it runs the
//! bundled character-level Shakespeare model (`data/shakespeare-llama`, made by
//! `train_llama`), sampling at temperature 0.8 with top-k 10 unless told otherwise.
//!
//! ```text
//! cargo run --release -p kiln-models --example generate -- --prompt "ROMEO:"
//! cargo run --release -p kiln-models --example generate -- --model DIR --prompt "Once upon a time"
//! cargo run --release -p kiln-models --example generate -- --model FILE.gguf --prompt "Hello" [--keep-quantized [--int8-activations]]
//! cargo run --release -p kiln-models --example generate -- --model DIR --quantize q8_0|q4_0|q4_k|int8 [--int8-activations]
//! cargo run --release -p kiln-models --example generate -- --model QUANTIZED_DIR --keep-quantized [--int8-activations]
//!     [--max-new-tokens 64] [--temperature 0.8 --top-k 40 --top-p 0.95 --seed 1]
//!     [--dtype f32|bf16] [--cuda]
//! ```

use std::io::Write;
use std::path::PathBuf;

use kiln::{DType, Device};
use kiln_models::gguf::Gguf;
use kiln_models::gpt2::Gpt2;
use kiln_models::llama::Llama;
use kiln_models::quantize::{QuantConfig, QuantKind, QuantReport};
use kiln_models::{
    Activations, CausalLm, Config, GenerateOptions, Generation, LoadOptions, Tokenizer, generate,
};
use kiln_runtime::quant::GgmlType;

const HOW_TO_GET_A_MODEL: &str = "\
generate --model DIR runs a local Hugging Face folder with config.json, model.safetensors
(or shards and model.safetensors.index.json) and tokenizer.json. kiln downloads nothing; get
one with git (git lfs install; git clone https://huggingface.co/openai-community/gpt2) or
`huggingface-cli download HuggingFaceTB/SmolLM2-135M --local-dir smollm2`, then:

    cargo run --release -p kiln-models --example generate -- --model gpt2 --prompt \"Hello\"

GPT-2 and the Llama family (Llama 2/3, TinyLlama, SmolLM, Qwen2) run. --model FILE.gguf runs
a llama.cpp GGUF file of the Llama family (its tokenizer inside), stopping at its EOS token;
--keep-quantized keeps its quantized projections in their blocks (CPU), and
--int8-activations quantizes their inputs too for integer products (as llama.cpp does).
--quantize q8_0|q4_0|q4_k|int8 stores the model's weights as those GGML blocks or per-channel
int8 rows after loading; a folder written by `convert --quantize` keeps them with
--keep-quantized.";

struct Args {
    model: Option<PathBuf>,
    /// Whether a sampling flag was given (the bundled model samples by default).
    sampling: bool,
    prompt: String,
    options: GenerateOptions,
    load: LoadOptions,
    /// `--quantize`: how the model's weights are stored after loading.
    quantize: Option<QuantKind>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        model: None,
        sampling: false,
        prompt: "The".into(),
        options: GenerateOptions { max_new_tokens: 64, ..GenerateOptions::default() },
        load: LoadOptions::default(),
        quantize: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<f64>().map_err(|e| format!("{flag}: {e}"));
        args.sampling |= matches!(flag.as_str(), "--temperature" | "--top-k" | "--top-p");
        match flag.as_str() {
            "--model" => args.model = Some(PathBuf::from(value()?)),
            "--prompt" => args.prompt = value()?,
            "--max-new-tokens" => args.options.max_new_tokens = number(value()?)? as usize,
            "--temperature" => args.options.temperature = number(value()?)?,
            "--top-k" => args.options.top_k = Some(number(value()?)? as usize),
            "--top-p" => args.options.top_p = Some(number(value()?)?),
            "--repetition-penalty" => args.options.repetition_penalty = number(value()?)?,
            "--seed" => args.options.seed = number(value()?)? as u64,
            "--no-cache" => args.options.use_cache = false,
            "--keep-quantized" => args.load.keep_quantized = true,
            "--int8-activations" => args.load.activations = Activations::Int8,
            "--quantize" => {
                args.quantize = Some(match value()?.as_str() {
                    "q8_0" => GgmlType::Q8_0.into(),
                    "q4_0" => GgmlType::Q4_0.into(),
                    "q4_k" => GgmlType::Q4_K.into(),
                    "int8" => QuantKind::Int8,
                    other => return Err(format!("--quantize {other}: q8_0, q4_0, q4_k or int8")),
                });
            }
            "--cuda" => args.load.device = Device::Cuda(0),
            "--dtype" => {
                args.load.dtype = match value()?.as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    "f16" => DType::F16,
                    other => return Err(format!("--dtype {other}: f32, bf16 or f16")),
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn run(model: &impl CausalLm, tokenizer: &Tokenizer, args: &Args) -> kiln::Result<Generation> {
    let prompt = tokenizer.encode(&args.prompt, true)?;
    print!("{}", args.prompt);
    let mut ids: Vec<i64> = Vec::new();
    let mut shown = 0;
    // Decode all the new tokens each time and print what was added: a token may complete a
    // character another one began.
    let generation = generate(model, &[prompt], &args.options, |_, token| {
        ids.push(token);
        if let Ok(text) = tokenizer.decode(&ids, true)
            && text.len() > shown
            && text.is_char_boundary(shown)
        {
            print!("{}", &text[shown..]);
            shown = text.len();
            let _ = std::io::stdout().flush();
        }
    })?;
    println!();
    Ok(generation)
}

/// Quantizes a model as `--quantize` says (and the activations as `--int8-activations`
/// says) with `quantize_`, reporting what stayed in floats.
fn quantize_with(
    args: &Args,
    quantize_: impl FnOnce(&QuantConfig) -> kiln::Result<QuantReport>,
) -> kiln::Result<()> {
    if let Some(kind) = args.quantize {
        let config = QuantConfig { activations: args.load.activations, ..QuantConfig::new(kind) };
        let report = quantize_(&config)?;
        eprintln!("quantized {} weights to {kind}", report.quantized.len());
        for (name, why) in &report.kept {
            eprintln!("  kept {name}: {why}");
        }
    }
    Ok(())
}

/// Runs the Hugging Face folder `dir`.
fn from_folder(dir: &std::path::Path, args: &Args) -> kiln::Result<Generation> {
    let tokenizer = Tokenizer::from_dir(dir)?;
    match Config::from_dir(dir)? {
        Config::Gpt2(_) => {
            let mut model = Gpt2::from_pretrained(dir, args.load)?;
            quantize_with(args, |config| model.quantize_(config))?;
            run(&model, &tokenizer, args)
        }
        Config::Llama(_) => {
            let mut model = Llama::from_pretrained(dir, args.load)?;
            quantize_with(args, |config| model.quantize_(config))?;
            run(&model, &tokenizer, args)
        }
        Config::Bert(_) => Err(kiln::Error::Value {
            op: "generate",
            detail: format!(
                "{} holds a BERT encoder, which does not generate text \
                 (kiln_models::SentenceEncoder embeds sentences with it)",
                dir.display()
            ),
        }),
    }
}

fn main() {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}\n\n{HOW_TO_GET_A_MODEL}");
            std::process::exit(2);
        }
    };
    let mut args = args;
    let dir = match args.model.clone() {
        Some(dir) => dir,
        None => {
            let bundled =
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/shakespeare-llama");
            eprintln!(
                "no --model: the bundled character-level Shakespeare model ({}); --model DIR \
                 runs a local Hugging Face folder (GPT-2, the Llama family)\n",
                bundled.display()
            );
            if !args.sampling {
                args.options.temperature = 0.8;
                args.options.top_k = Some(10);
            }
            bundled
        }
    };
    let mut result = || {
        let generation = if dir.is_file() {
            let file = Gguf::open(&dir)?;
            if let Some(eos) = file.get("tokenizer.ggml.eos_token_id").and_then(|v| v.as_u64()) {
                args.options.stop_tokens.push(eos as i64);
            }
            let tokenizer = Tokenizer::from_gguf(&file)?;
            let mut model = Llama::load_gguf(&file, args.load)?;
            quantize_with(&args, |config| model.quantize_(config))?;
            run(&model, &tokenizer, &args)?
        } else {
            from_folder(&dir, &args)?
        };
        eprintln!(
            "prefill: {} tokens in {:.1} ms ({:.1} tokens/s); decode: {} tokens in {:.1} ms ({:.1} tokens/s){}",
            generation.prompt_len,
            generation.prefill.as_secs_f64() * 1e3,
            generation.prefill_tokens_per_second(),
            generation.decode_steps,
            generation.decode.as_secs_f64() * 1e3,
            generation.decode_tokens_per_second(),
            generation
                .stats
                .map(|s| format!("; decode plans built: {}", s.plans))
                .unwrap_or_default()
        );
        Ok::<(), kiln::Error>(())
    };
    if let Err(e) = result() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
